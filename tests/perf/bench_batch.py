"""Batch output tokens/s through the platform against vLLM's offline `LLM.generate`, on
the same prompts and engine config, in one run.

    .venv/bin/python tests/perf/bench_batch.py [--requests 512] [--max-tokens 128]

Platform: upload + create over HTTP (the API), the dispatcher (validation, chunking,
budget, queueing, finalizing), a Celery worker process (`-c 1 --pool prefork`) with its
warm engine, Parquet parts and the assembled output file in the object store; timed
from the upload until the batch reads `completed`. Baseline: the same token ids through
one `LLM.generate` call in this process, with the same engine arguments and the same
in-process engine core. Rounds alternate baseline and platform, so a busy spell of a
shared machine weighs on both; the median and best ratios are reported, and, steadier
on a busy machine, the ratio of output tokens per CPU-second (every platform process
against this one), the platform's own share of the wall time (all but the worker's
time in its chunks), and the worker's way of calling the engine (a call per chunk, a
SamplingParams per request) timed on the baseline's engine in this process. Every request emits exactly `--max-tokens` tokens (`ignore_eos`,
greedy), so both make the same tokens.

Broker: Redis from LEDGERLM_TEST_REDIS when set, else the embedded SQLite broker. Event
log: embedded SQLite, or Kafka with `--kafka`. Object store: S3 from LEDGERLM_TEST_S3*
when set, else a local directory.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform as host
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # as the batch worker runs it

from models.events_batch import BatchChunkCompleted  # noqa: E402
from models.settings import Settings  # noqa: E402
from pipelines import admin  # noqa: E402
from pipelines.batch.tokens import encode_completion, tokenizer_for  # noqa: E402
from workers.tiny_model import make_tiny_model  # noqa: E402
from workers.vllm_engine import VllmEngineConfig, engine_config_hash  # noqa: E402


def prompts(n: int) -> list[str]:
    return [f"Entry {i} of the ledger: the merchant recorded a sale of {i * 7 % 97} barrels" for i in range(n)]


def cpu_seconds(pid: int, *, tree: bool) -> float:
    """User + system CPU time of a process, and of its live descendants when `tree`."""
    import psutil

    process = psutil.Process(pid)
    return sum(t.user + t.system for t in (p.cpu_times() for p in
                                           [process, *(process.children(recursive=True) if tree else [])]))


def baseline(config: VllmEngineConfig, token_ids: list[list[int]], max_tokens: int, tenant: str):
    from vllm import LLM, SamplingParams

    llm = LLM(**config.engine_args())
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": ids, "cache_salt": tenant} for ids in token_ids[:8]], params,
                 use_tqdm=False)  # warm-up

    def run() -> tuple[float, float, int]:
        cpu, began = cpu_seconds(os.getpid(), tree=False), time.monotonic()
        outputs = llm.generate([{"prompt_token_ids": ids, "cache_salt": tenant} for ids in token_ids], params,
                               use_tqdm=False)
        return (time.monotonic() - began, cpu_seconds(os.getpid(), tree=False) - cpu,
                sum(len(o.outputs[0].token_ids) for o in outputs))

    def run_chunked(chunk_size: int) -> float:
        """The worker's own way on this engine: one call per chunk, one SamplingParams per request."""
        began = time.monotonic()
        for start in range(0, len(token_ids), chunk_size):
            part = token_ids[start:start + chunk_size]
            llm.generate([{"prompt_token_ids": ids, "cache_salt": tenant} for ids in part],
                         [SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True) for _ in part],
                         use_tqdm=False)
        return time.monotonic() - began

    return run, run_chunked


def platform_settings(args, home: Path) -> tuple[Settings, object, str]:
    from tests.integration.batch_fixtures import _log_opener

    log_settings, opener = _log_opener("kafka" if args.kafka else "embedded", home)
    store = {"object_store_url": f"file://{home}/objects"}
    if os.environ.get("LEDGERLM_TEST_S3"):
        from tests.integration.batch_fixtures import s3_settings

        store = s3_settings()
    broker = os.environ.get("LEDGERLM_TEST_REDIS") or f"sqla+sqlite:///{home}/celery.db"
    settings = Settings(home=home, **log_settings, **store, celery_broker_url=broker,
                        batch_queue=f"bench-{uuid.uuid4().hex[:8]}", batch_chunk_time_limit_s=600,
                        kv_cache_gb=args.kv_cache_gb, engine_max_seqs=args.max_num_seqs, max_model_len=512)
    return settings, opener, broker


class PlatformRun:
    """The platform up, its worker's engine warm; `run()` times one batch through it."""

    def __init__(self, args, model: Path, config_hash: str, lines: list[dict]):
        from tests.integration.batch_fixtures import BatchPlatform

        home = Path(tempfile.mkdtemp(prefix="bench-batch-"))
        self.settings, opener, broker = platform_settings(args, home)
        self.lines = lines
        self.plat = BatchPlatform("bench", self.settings, opener, f"tiny@{config_hash}", chunk_size=args.chunk_size,
                                  chunks_in_flight=args.chunks_in_flight)
        self.info = {"chunks": -(-len(lines) // args.chunk_size), "broker": broker.split("://")[0],
                     "event_log": "kafka" if args.kafka else "embedded",
                     "object_store": self.settings.object_store_url.split("://")[0]}
        try:
            self.plat.start()
            admin.approve_model(self.plat.view, alias="tiny", model_revision=self.plat.model_revision,
                                model_path=str(model), engine_config_hash=config_hash, max_model_len=512, actor="bench")
            self.tenant, secret = self.plat.tenant()
            self.client = self.plat.openai(secret)
            self._submit(lines[:8])  # warm-up: the worker starts its engine on its first chunk
        except BaseException:
            self.plat.close()
            raise

    def _submit(self, data: list[dict]):
        raw = "".join(json.dumps(line) + "\n" for line in data).encode()
        file = self.client.files.create(file=("bench.jsonl", io.BytesIO(raw)), purpose="batch")
        batch = self.client.batches.create(input_file_id=file.id, endpoint="/v1/completions", completion_window="24h")
        return self.plat.wait_terminal(lambda: self.client.batches.retrieve(batch.id), timeout_s=3600)

    def run(self) -> tuple[float, float, int, list[float]]:
        # CPU of every platform process: the worker (main and child), and this one (API, dispatcher).
        def worker_cpu() -> float:
            return cpu_seconds(self.plat.worker.proc.pid, tree=True)

        worker, here, began = worker_cpu(), cpu_seconds(os.getpid(), tree=False), time.monotonic()
        done = self._submit(self.lines)
        seconds = time.monotonic() - began
        self.api_and_dispatcher_cpu_s = cpu_seconds(os.getpid(), tree=False) - here
        cpu = worker_cpu() - worker + self.api_and_dispatcher_cpu_s
        assert done.status == "completed" and done.request_counts.completed == len(self.lines), done
        # Time the worker spent in its chunks (reading input, generating, writing the part).
        chunks = [env.payload for _, env in self.plat.events(self.tenant)
                  if isinstance(env.payload, BatchChunkCompleted) and env.payload.batch_id == done.id]
        return seconds, cpu, done.usage.output_tokens, [c.duration_ms / 1000 for c in chunks]

    def close(self) -> None:
        self.plat.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--chunk-size", type=int, default=128)
    parser.add_argument("--chunks-in-flight", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--kv-cache-gb", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kafka", action="store_true", help="the event log on Kafka (LEDGERLM_TEST_KAFKA)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    model = make_tiny_model(Path(tempfile.gettempdir()) / "ledgerlm-bench-tiny")
    config = VllmEngineConfig(model=model, max_model_len=512, max_num_seqs=args.max_num_seqs,
                              kv_cache_gb=args.kv_cache_gb)
    texts = prompts(args.requests)
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": "tiny", "prompt": text, "max_tokens": args.max_tokens, "temperature": 0,
                       "ignore_eos": True}} for i, text in enumerate(texts)]
    tokenizer = tokenizer_for(str(model))
    token_ids = [encode_completion(tokenizer, text) for text in texts]

    run_baseline, run_chunked = baseline(config, token_ids, args.max_tokens, tenant="bench")
    platform = PlatformRun(args, model, engine_config_hash(config), lines)
    rounds = []
    try:
        for _ in range(args.rounds):  # interleaved, so a busy spell of a shared machine hits both
            base_s, base_cpu, base_tokens = run_baseline()
            plat_s, plat_cpu, plat_tokens, chunk_s = platform.run()
            chunked_s = run_chunked(args.chunk_size)
            assert plat_tokens == base_tokens == args.requests * args.max_tokens
            rounds.append({"baseline_tps": base_tokens / base_s, "platform_tps": plat_tokens / plat_s,
                           "ratio": base_s / plat_s, "cpu_ratio": base_cpu / plat_cpu, "baseline_s": base_s,
                           "chunked_here_s": chunked_s,
                           "platform_s": plat_s, "worker_chunk_s": sum(chunk_s), "baseline_cpu_s": base_cpu,
                           "platform_cpu_s": plat_cpu,
                           "api_and_dispatcher_cpu_s": platform.api_and_dispatcher_cpu_s,
                           "load_avg": os.getloadavg()[0]})
    finally:
        platform.close()
    result = {
        "requests": args.requests, "max_tokens": args.max_tokens, "output_tokens": args.requests * args.max_tokens,
        "chunk_size": args.chunk_size, "max_num_seqs": args.max_num_seqs, "platform": platform.info,
        "rounds": rounds, "median_ratio": statistics.median(r["ratio"] for r in rounds),
        "median_cpu_ratio": statistics.median(r["cpu_ratio"] for r in rounds),
        "median_chunked_here_ratio": statistics.median(r["baseline_s"] / r["chunked_here_s"] for r in rounds),
        "platform_overhead": sum(r["platform_s"] - r["worker_chunk_s"] for r in rounds)
        / sum(r["platform_s"] for r in rounds),
        "best_ratio": max(r["platform_tps"] for r in rounds) / max(r["baseline_tps"] for r in rounds),
        "cpus": os.cpu_count(), "python": host.python_version(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
