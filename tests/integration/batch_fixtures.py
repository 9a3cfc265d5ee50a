"""Pytest plugin: the batch platform on real services, once per event-log adapter.

    API (uvicorn, in this process)  ─┐
    batch dispatcher (a thread)      ├─ event log: embedded SQLite file, or real Kafka
    Celery batch worker (a process:  │  object store: the real S3 server (bucket ledgerlm-test)
      celery -A workers.batch.celery_app worker -c 1 --pool prefork)
                                     └─ broker: the real Redis

A missing service variable fails the tests: they exist to run against the real thing.
Each session gets its own S3 prefix, Celery queue and (on Kafka) topic namespace, so
concurrent test sessions on the same services never take each other's work.
"""
from __future__ import annotations

import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from api.app import create_app
from models import topics
from models.events import decode, new_event
from models.events_admin import TenantLimitsChanged
from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.batch.dispatcher import BatchDispatcher, limits_from_settings
from pipelines.batch.reconcile import DispatchOptions
from pipelines.bootstrap import Bootstrap
from pipelines.eventlog import partition_for
from tests.conftest import make_log_opener, service_url
from tests.harness import MODEL_ALIAS, Loop, api_services, serve_api
from tests.helpers import Launched, wait_until
from workers.vllm_engine import VllmEngineConfig, engine_config_hash


CHUNK_SIZE = 4
WORKER_READY_S = 120
TERMINAL = {"completed", "failed", "expired", "cancelled"}


def s3_settings() -> dict:
    endpoint = service_url("s3")
    for var in ("LEDGERLM_TEST_S3_KEY", "LEDGERLM_TEST_S3_SECRET"):
        if not os.environ.get(var):
            pytest.fail(f"{var} is not set: source .local/services.env (or run `make test`)", pytrace=False)
    bucket = os.environ.get("LEDGERLM_TEST_S3_BUCKET", "ledgerlm-test")
    return {"object_store_url": f"s3://{bucket}/run-{uuid.uuid4().hex[:12]}", "s3_endpoint_url": endpoint,
            "s3_key": os.environ["LEDGERLM_TEST_S3_KEY"], "s3_secret": os.environ["LEDGERLM_TEST_S3_SECRET"]}


def _env_of(settings: Settings) -> dict[str, str]:
    names = ("home", "event_log_url", "event_log_namespace", "object_store_url", "s3_endpoint_url", "s3_key",
             "s3_secret", "celery_broker_url", "batch_queue", "batch_chunk_time_limit_s", "kv_cache_gb",
             "engine_max_seqs", "max_model_len")
    return {f"LEDGERLM_{n.upper()}": str(getattr(settings, n)) for n in names if getattr(settings, n) is not None}


class CeleryWorker(Launched):
    """`celery worker` as a child process; its own child runs the chunks. Stopping it sends
    SIGTERM to the main process only: a warm shutdown, in which it stops its child."""

    def __init__(self, settings: Settings, log_path: Path, app: str = "workers.batch.celery_app"):
        super().__init__(
            [sys.executable, "-m", "celery", "-A", app, "worker", "-Q", settings.batch_queue,
             "-c", "1", "--pool", "prefork", "-l", "INFO", "-n", f"{settings.batch_queue}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            env={**os.environ, **_env_of(settings), "PYTHONUNBUFFERED": "1"}, log=log_path,
            ready="ready.", ready_s=WORKER_READY_S)

    def children(self) -> list[int]:
        return [c.pid for c in psutil.Process(self.proc.pid).children()]


@dataclass
class BatchPlatform:
    kind: str
    settings: Settings
    open_log: object
    model_revision: str
    chunk_size: int = CHUNK_SIZE
    chunks_in_flight: int = 2
    celery_app: str = "workers.batch.celery_app"  # the worker's `celery -A`
    requeue_after_s: float = DispatchOptions.requeue_after_s
    logs: list = field(default_factory=list)

    def start(self) -> "BatchPlatform":
        platform = Bootstrap(self.settings)
        self.admin_log = self._log()
        self.view = platform.registry_view(self.admin_log)
        self.store = platform.object_store()
        self.worker = CeleryWorker(self.settings, self.settings.home / "celery-worker.log", self.celery_app)
        queue = platform.chunk_queue()
        log = self._log()
        self.dispatcher = BatchDispatcher(
            log, platform.registry_view(log), self.store, queue, limits_for=limits_from_settings(self.settings),
            options=DispatchOptions(chunk_size=self.chunk_size, chunks_in_flight=self.chunks_in_flight,
                                    stop_grace_s=30, chunk_time_limit_s=self.settings.batch_chunk_time_limit_s,
                                    requeue_after_s=self.requeue_after_s))
        self.loop = Loop("batch-dispatcher", lambda: self.dispatcher.run_once(0.05),
                         lambda: (self.dispatcher.close(), queue.close())).start()
        self.server, self._server_thread, self.port = serve_api(
            create_app(api_services(self.settings, self._log())), "batch-api")
        return self

    def _log(self):
        log = self.open_log()
        self.logs.append(log)
        return log

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tenant(self, scopes: tuple[str, ...] = ("batch",)) -> tuple[str, str]:
        tenant_id = "t" + uuid.uuid4().hex[:10]
        admin.create_tenant(self.view, tenant_id=tenant_id, name=tenant_id, actor="tests")
        secret, _ = admin.issue_key(self.view, tenant_id=tenant_id, actor="tests", scopes=scopes)
        return tenant_id, secret

    def set_batch_limit(self, tenant_id: str, tokens: int) -> None:
        env = new_event(TenantLimitsChanged(tenant_id=tenant_id, batch_tokens_per_window=tokens, actor="tests"),
                        tenant_id=tenant_id, correlation_id=uuid.uuid4().hex)
        admin._append(self.admin_log, env)  # noqa: SLF001 - no admin command for limits yet

    def openai(self, secret: str):
        import openai

        return openai.OpenAI(api_key=secret, base_url=self.base_url + "/v1", max_retries=0, timeout=60)

    def http(self, secret: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=60)

    def events(self, tenant_id: str) -> list[tuple[int, object]]:
        """(offset, envelope) of the tenant's batch events, in log order."""
        return self.event_tail(tenant_id)()

    def event_tail(self, tenant_id: str):
        """A reader of the tenant's batch events that remembers where it stopped: each call
        reads only what was appended since and returns everything seen so far. Polling with
        it stays quick however long the shared log has grown."""
        partition = partition_for(tenant_id, self.admin_log.partitions(topics.BATCHES.name))
        seen: list[tuple[int, object]] = []
        offset = 0

        def read() -> list[tuple[int, object]]:
            nonlocal offset
            for record in self.admin_log.read_partition(topics.BATCHES.name, partition, offset):
                if (env := decode(record.value)).tenant_id == tenant_id:
                    seen.append((record.offset, env))
                offset = record.offset + 1
            return list(seen)
        return read

    def wait_terminal(self, get, timeout_s: float = 240):
        """Polls `get()` (a batch or summarization) until it ends."""
        def ended():
            self.check()
            job = get()
            return job if job.status in TERMINAL else None
        return wait_until(ended, timeout_s, every_s=0.2, what="the batch to end")

    def check(self) -> None:
        if self.loop.error is not None:
            raise AssertionError(f"the dispatcher crashed: {self.loop.error!r}") from self.loop.error
        self.worker.check()

    def close(self) -> None:
        """Stops whatever `start` got to, so a failed start leaves no process behind."""
        if hasattr(self, "server"):
            self.server.should_exit = True
            self._server_thread.join(15)
        if hasattr(self, "loop"):
            self.loop.halt()
        if hasattr(self, "worker"):
            self.worker.stop()
        for log in self.logs:
            log.close()
        if hasattr(self, "store"):
            try:
                self.store.fs.rm(self.store.root, recursive=True)
            except FileNotFoundError:
                pass


def _log_opener(kind: str, home: Path) -> tuple[dict, object]:
    """The settings naming one fresh log of `kind`, and an opener of handles onto it."""
    opener = make_log_opener(kind, home, prefix="b")
    return {name: getattr(opener.settings, name) for name in ("event_log_url", "event_log_namespace")}, opener


@pytest.fixture(scope="session", params=["embedded", "kafka"])
def batch_platform(request, tiny_model_dir, tmp_path_factory):
    home = tmp_path_factory.mktemp(f"batch-{request.param}")
    log_settings, opener = _log_opener(request.param, home)
    settings = Settings(home=home, **log_settings, **s3_settings(), celery_broker_url=service_url("redis"),
                        batch_queue=f"batch-{uuid.uuid4().hex[:8]}", batch_chunk_time_limit_s=120,
                        batch_max_file_bytes=1_000_000, kv_cache_gb=0.125, engine_max_seqs=8, max_model_len=512)
    config = VllmEngineConfig(model=tiny_model_dir, max_model_len=512)
    config_hash = engine_config_hash(config)
    plat = BatchPlatform(request.param, settings, opener, f"tiny@{config_hash}")
    started = time.monotonic()
    try:
        plat.start()
        admin.approve_model(plat.view, alias=MODEL_ALIAS, model_revision=plat.model_revision,
                            model_path=str(tiny_model_dir), engine_config_hash=config_hash, max_model_len=512,
                            actor="tests", price_input_per_1k_micros=1000, price_output_per_1k_micros=2000)
        plat.startup_s = time.monotonic() - started
        yield plat
    finally:
        plat.close()
