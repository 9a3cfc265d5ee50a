"""The one settings class. Built by entrypoints from the environment (`LEDGERLM_*`), then
passed down; adapters are chosen by the scheme of their URL."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from models.engine_settings import EngineSettings
from models.prompt_class import LONG_MIN_TOKENS, SHORT_MAX_TOKENS, check_thresholds

DEFAULT_HOME = Path(".local/ledgerlm")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LEDGERLM_", extra="ignore")

    home: Path = DEFAULT_HOME
    # kafka://host:port[,host:port] or sqlite:///path/to/log.db (default: under home)
    event_log_url: str = ""
    # Prefix for every topic and consumer group, so environments can share one cluster.
    event_log_namespace: str = ""
    # How Kafka clients authenticate and encrypt (pipelines.kafka_security): SASL (PLAIN or
    # SCRAM) with a username and password, TLS with a CA file (and a client certificate), or both.
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = Field(default=None, repr=False)
    kafka_ssl_cafile: str | None = None
    kafka_ssl_certfile: str | None = None
    kafka_ssl_keyfile: str | None = None
    kafka_ssl_check_hostname: bool = True
    # Copies of each partition the platform's topics are made with (1 for one broker; 3 on a
    # cluster, with min.insync.replicas=2). Unset: the cluster's default.replication.factor.
    kafka_replication_factor: int | None = Field(default=None, ge=1)
    # any SQLAlchemy URL: postgresql+psycopg://... or sqlite:///...
    database_url: str = ""
    # s3://bucket/prefix or file:///path
    object_store_url: str = ""
    s3_endpoint_url: str | None = None
    s3_key: str | None = None
    s3_secret: str | None = None
    # redis://... for production and tests; the embedded default needs no server
    celery_broker_url: str = ""
    # Batch jobs: the Celery queue, chunking, limits (None: unlimited until tenant limits say).
    batch_queue: str = "batch"
    batch_chunk_size: int = Field(default=64, gt=0)
    batch_chunks_in_flight: int = Field(default=4, gt=0)  # per batch: how far ahead chunks are queued
    batch_max_file_bytes: int = Field(default=200 * 1024 * 1024, gt=0)
    batch_max_requests: int = Field(default=50_000, gt=0)
    batch_chunk_time_limit_s: float = Field(default=900.0, gt=0)
    batch_requeue_after_s: float = Field(default=600.0, gt=0)  # a queued chunk not started this long is sent again
    batch_tokens_per_day: int | None = None
    batch_spend_per_day_micros: int | None = None

    model: Path | None = None  # a Hugging Face model directory; a tiny one is generated when unset
    model_alias: str = "tiny"
    max_model_len: int = 512
    kv_cache_gb: float = 1.0
    engine_max_seqs: int = 16
    # The served revision's engine settings, which a worker copies from it (None: the CPU's).
    engine_settings: EngineSettings | None = None
    # What builds a pool worker's inference engine from settings, as "module:callable"; it
    # is imported only when an engine is made (tests name a fake one the same way).
    engine_factory: str = "workers.vllm_engine:VllmEngine.from_settings"
    # Added to the nice value of vLLM's engine processes (0: unchanged): on a shared host the
    # platform's own threads then never wait for a CPU behind model compute.
    engine_nice: int = Field(default=10, ge=0, le=19)
    # Keep vLLM's scheduler process on the CPUs its compute threads are bound to, not
    # beside the platform's threads: more output at saturation, at some cost to a light
    # tenant's first token while a heavy one floods (tests/perf/RESULTS.md).
    engine_pinned: bool = False
    # vLLM's own per-step stats (KV-cache usage, preemptions, step times) for the worker's
    # metrics; off, the engine skips making them.
    engine_stats: bool = True
    # Generations a pool worker starts beyond the engine's capacity; they wait inside the
    # engine, so a finished sequence is replaced at the next step (None: the capacity again).
    worker_take_ahead: int | None = None
    # How long a generation's later tokens may wait to share one stream event (ms), with
    # the engine's every sequence streaming; proportionally less with fewer. Its first
    # tokens and its end never wait.
    stream_linger_ms: float = 40.0
    # The semantic cache of the API (pipelines.cache.semantic), where a tenant's policy turns
    # it on: how prompts are embedded ("minilm": all-MiniLM-L6-v2 on the CPU; "hashing": a
    # bag of words, for tests only), and how many answers it holds per tenant.
    cache_embedder: Literal["minilm", "hashing"] = "minilm"
    cache_max_entries_per_tenant: int = Field(default=100_000, gt=0)
    # Prefix-cache affinity (pipelines.admission.placement): whether the API names what a request's
    # prompt shares with others (its tenant and system prompt), so admission places such
    # requests on one worker while it has a slot free; and, once every worker is full, how
    # many more queued requests one worker may hold than the least loaded one.
    work_affinity: bool = True
    work_affinity_slack: int = Field(default=2, ge=1)
    # A worker that also runs admission for the tenant partitions it is given: work it can
    # start at once is admitted and taken in one commit (see `pipelines.admission.processor`).
    worker_admits: bool = False
    # How long one thread of a serving process may run Python before another waiting one
    # gets its turn (ms; Python's own default is 5). These processes run many threads that
    # each do a little per wake-up; with shorter turns, the one carrying a light tenant's
    # first token waits less behind threads busy with a heavy tenant's stream.
    switch_interval_ms: float = Field(default=1.0, gt=0, le=100)
    # The CPUs a serving process runs its threads on, as a Linux CPU list ("1", "0-3,8"), or
    # "all" for wherever the OS puts them. Empty (the default): a pool worker keeps off the
    # CPUs its engine bound its compute threads to and prints the ones it uses; the API and
    # admission go anywhere. On a host shared with an engine, give them the CPUs the worker
    # printed, so no platform thread preempts model compute.
    cpus: str = ""

    # Where a process other than the API serves `GET /metrics` (the API serves its own on
    # its port): admission, a pool worker, the projector, the batch dispatcher, each batch
    # worker's child. 0: not served (the default). One port per process: set it per process.
    metrics_port: int = Field(default=0, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    # Who may read the API's `/metrics` and its docs (`/docs`, `/redoc`, `/openapi.json`):
    # "open" (anyone), "key" (a bearer of `ops_token`, the bootstrap token or an operator's
    # key), or "off" (404). Both name tenant ids: keep them off the internet or set "key".
    metrics_access: Literal["open", "key", "off"] = "open"
    docs_access: Literal["open", "key", "off"] = "open"
    ops_token: str | None = Field(default=None, repr=False)  # e.g. a Prometheus scraper's bearer token

    api_host: str = "127.0.0.1"
    api_port: int = 8000
    bootstrap_token: str | None = None  # platform admin credential for the first tenant and keys
    # The development default is refused by the projector on a Kafka log or a PostgreSQL database.
    audit_signing_key: str = Field(default="dev-only-change-me", repr=False)
    # How often the projector signs the newest record of each audit chain (and at shutdown).
    audit_seal_every_s: float = Field(default=30.0, gt=0)
    # The platform secret each tenant's text-digest key is derived from (models.digests):
    # prompt and output digests on durable topics are HMACs under it. Unset: derived from
    # `audit_signing_key`.
    digest_key: str | None = Field(default=None, repr=False)
    # Ed25519 public keys (urlsafe base64, comma-separated) whose signatures over a model
    # directory's digests the platform accepts at approval and checks again when a worker
    # starts (pipelines.artifacts). With `require_signed_artifacts`, a revision without a
    # signature that verifies is neither approved nor served.
    artifact_trusted_keys: str | None = None
    require_signed_artifacts: bool = False
    grace_s: float = 30.0
    # How long a generation outlives its client's disconnect, so the client can reconnect
    # (`Last-Event-ID`) and lose nothing. The engine keeps generating meanwhile and the
    # tenant is charged for what it generated; usage shows what was delivered beside it.
    disconnect_grace_s: float = Field(default=2.0, ge=0)
    # A worker silent this long (no heartbeat, no leave) is lost: admission ends its running
    # generations (`worker_lost`) and settles them. Five missed beats of a 1 s interval: a
    # loaded host can hold a beat back a second or two, and a false loss ends running work.
    worker_lost_after_s: float = Field(default=5.0, gt=0)
    # How long a consumer group waits for a silent member before handing its partitions to
    # the others; None: the log's own (10 s embedded, 30 s on Kafka, where a broker restart
    # must not drop every member). A worker judged lost is evicted from its groups at once,
    # so this bounds only what nobody judges (no admission running, a member outside the
    # fleet). Kafka brokers refuse sessions below `group.min.session.timeout.ms` (6 s).
    group_session_timeout_s: float | None = Field(default=None, gt=0)
    # How much work may wait per (pool, revision): this many requests per live slot, never
    # fewer than the floor; high priority twice as many, so normal work is shed first when
    # capacity falls (`pipelines.admission.capacity.QueueBound`).
    admission_queued_per_slot: float = Field(default=4.0, gt=0)
    admission_queued_floor: int = Field(default=512, ge=0)
    # How far admission may overcommit each revision's KV cache: it starts requests while the
    # KV claims of what runs and waits there (prompt plus max output tokens each) stay within
    # this many times the live workers' KV-cache tokens, and queues or sheds (`kv_capacity`)
    # past it; each worker starts work within the same multiple of its own engine's cache.
    # Above 1 runs more at once, as most requests stop well short of their max output, at
    # the risk of engine preemptions (recomputed prompts, slower tokens) when they do not.
    kv_overcommit: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    # The least service admission assumes for a revision before it has measured any (ms to
    # the first token, then per further output token): deadlines are judged and the queue
    # drained at this pace until completions say better (`pipelines.admission.capacity.Floors`). The
    # defaults are far below any real engine, so only hopeless deadlines are refused.
    admission_floor_first_token_ms: float = Field(default=5.0, ge=0, allow_inf_nan=False)
    admission_floor_ms_per_output_token: float = Field(default=0.5, ge=0, allow_inf_nan=False)
    # The desired replica count admission exports (`ledgerlm_desired_replicas`,
    # pipelines.admission.signals): each replica planned at this share of its measured
    # goodput (as `ledgerlm capacity plan --ceiling`), from the requests admitted over the window.
    autoscale_utilization_ceiling: float = Field(default=0.7, gt=0, le=1)
    autoscale_window_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    default_deadline_ms: int = 120_000
    # How long the API waits for admission's decision on a request (and for the log) before
    # answering 503 `admission_timeout` / `log_unavailable` with Retry-After; a request
    # appended meanwhile is cancelled, so a reservation made for it later is released.
    decision_timeout_s: float = Field(default=5.0, gt=0)
    # Workload classes by prompt length (models.prompt_class): a prompt of at most the first
    # many input tokens is short, one of at least the second is long, medium between. They
    # label the API's latency histograms and group the SLO report (`ledgerlm slo report`).
    prompt_short_max_tokens: int = Field(default=SHORT_MAX_TOKENS, ge=0)
    prompt_long_min_tokens: int = Field(default=LONG_MIN_TOKENS, ge=0)

    @model_validator(mode="after")
    def _embedded_defaults(self) -> "Settings":
        # Whatever is not configured runs embedded, in files under `home`.
        home = self.home.resolve()
        self.event_log_url = self.event_log_url or f"sqlite:///{home}/eventlog.db"
        self.database_url = self.database_url or f"sqlite:///{home}/ledgerlm.db"
        self.object_store_url = self.object_store_url or f"file://{home}/objects"
        self.celery_broker_url = self.celery_broker_url or f"sqla+sqlite:///{home}/celery.db"
        return self

    @model_validator(mode="after")
    def _prompt_classes(self) -> "Settings":
        check_thresholds(self.prompt_short_max_tokens, self.prompt_long_min_tokens)
        return self

    @field_validator("cpus")
    @classmethod
    def _cpu_list(cls, value: str) -> str:
        value = value.strip()
        if value not in ("", "all"):
            parse_cpu_list(value)
        return value

    def cpu_set(self) -> set[int] | None:
        """The CPUs `cpus` names; None where it leaves the choice to someone else."""
        return None if self.cpus in ("", "all") else parse_cpu_list(self.cpus)

    def ensure_home(self) -> Path:
        self.home.mkdir(parents=True, exist_ok=True)
        return self.home


def parse_cpu_list(text: str) -> set[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8}; a clear ValueError for anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last) if dash else int(first)
        except ValueError:
            raise ValueError(f"not a CPU list: {text!r} (expected e.g. '1' or '0-3,8')") from None
        if low < 0 or high < low:
            raise ValueError(f"not a CPU list: {text!r} (a range goes from low to high, from 0)")
        cpus.update(range(low, high + 1))
    return cpus


def format_cpu_list(cpus: set[int]) -> str:
    """{0, 1, 2, 3, 8} -> '0-3,8'."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)
