"""Two models served at once against each alone: the tiny random model and SmolLM2-135M,
each on a worker of its own with the same engine settings, behind one API and admission on
the embedded log. Three phases in one run: tiny alone, SmolLM2 alone, both at once.

    .venv/bin/python tests/perf/bench_two_models.py [--seconds 30] [--concurrency 4]

Each engine binds its compute threads to a CPU of its own in every phase (tiny on CPU 0,
SmolLM2 on CPU 1, `VLLM_CPU_OMP_THREADS_BIND`), so the phases differ only in what else
runs. Per model and phase: output tokens/s and TTFT p50/p95 from `--concurrency` streams
kept busy for `--seconds`, measured by a client in this process. Also the time from
re-pointing an alias to the first request that runs on the new revision. Appends the table
to the "Two models" section of RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.perf.bench_overhead import percentile  # noqa: E402
from tests.perf.results import record_run  # noqa: E402

SECTION = "## Two models"
CPU = {"tiny": "0", "smollm2": "1"}


def stream_one(client: httpx.Client, alias: str, i: int, tokens: int) -> tuple[float | None, int]:
    """(seconds to the first token, output tokens) of one streamed generation."""
    body = {"model_alias": alias, "input": f"Question {i}: what is a ledger used for?", "max_output_tokens": tokens,
            "ignore_eos": True}
    began, first, made = time.monotonic(), None, 0
    with client.stream("POST", "/v1/generations", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            frame = json.loads(line[6:])
            if frame["type"] == "tokens" and first is None:
                first = time.monotonic() - began
            if frame["type"] == "completed":
                made = frame["usage"]["output_tokens"]
    return first, made


def load(base: str, secret: str, alias: str, *, seconds: float, concurrency: int, tokens: int) -> dict:
    ttft: list[float] = []
    made = [0]
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client_loop(k: int) -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=300) as client:
            i = 0
            while time.monotonic() < end:
                first, out = stream_one(client, alias, k * 100_000 + i, tokens)
                i += 1
                with lock:
                    if first is not None:
                        ttft.append(first)
                    made[0] += out
    began = time.monotonic()
    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 300)
    took = time.monotonic() - began
    return {"tokens_per_s": made[0] / took, "ttft_p50_ms": percentile(ttft, 0.5) * 1000,
            "ttft_p95_ms": percentile(ttft, 0.95) * 1000, "requests": len(ttft)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=4, help="streams kept busy per model")
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()

    from api.demo import _wait_http
    from pipelines.admin import commands as admin
    from pipelines.bootstrap import Bootstrap
    from models.settings import Settings
    from tests.harness import free_port, new_tenant
    from tests.helpers import Launched
    from workers.small_model import default_dir

    home = Path(tempfile.mkdtemp(prefix="two-models-"))
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LEDGERLM_HOME": str(home), "LEDGERLM_API_PORT": str(port),
           "LEDGERLM_MAX_MODEL_LEN": "512", "LEDGERLM_KV_CACHE_GB": "0.25", "LEDGERLM_ENGINE_MAX_SEQS": "8",
           "LEDGERLM_CPUS": "all", "LEDGERLM_DEFAULT_DEADLINE_MS": "300000"}
    for key in ("LEDGERLM_EVENT_LOG_URL", "LEDGERLM_EVENT_LOG_NAMESPACE", "LEDGERLM_MODEL"):
        env.pop(key, None)
    small = default_dir(Path(".local/ledgerlm").resolve())
    py = sys.executable
    subprocess.run([py, "-m", "workers", "model", "approve", "--alias", "tiny"], env=env, check=True, timeout=600,
                   capture_output=True)
    subprocess.run([py, "-m", "workers", "model", "approve", "--alias", "smollm2"],
                   env={**env, "LEDGERLM_MODEL": str(small)}, check=True, timeout=600, capture_output=True)
    settings = Settings(home=home)
    platform = Bootstrap(settings)
    log = platform.event_log()
    view = platform.registry_view(log)
    _, secret = new_tenant(view, actor="bench")
    base = f"http://127.0.0.1:{port}"
    rows: dict[str, dict] = {}
    services = [Launched([py, "-m", "api.cli", "serve", name], env=env, log=home / f"{name}.log", stop_s=60)
                for name in ("admission", "api")]
    try:
        _wait_http(base + "/healthz", 60)

        def worker(alias: str) -> Launched:
            return Launched([py, "-m", "workers", "serve", "worker", "--alias", alias],
                            env={**env, "VLLM_CPU_OMP_THREADS_BIND": CPU[alias]}, log=home / f"worker-{alias}.log",
                            ready='"ready": true', ready_s=600, stop_s=60)

        for alias in ("tiny", "smollm2"):
            with worker(alias):
                rows[f"{alias} alone"] = load(base, secret, alias, seconds=args.seconds,
                                              concurrency=args.concurrency, tokens=args.tokens)
                print(alias, "alone", rows[f"{alias} alone"], flush=True)
        with worker("tiny"), worker("smollm2"):
            both: dict[str, dict] = {}
            threads = [threading.Thread(target=lambda a=a: both.__setitem__(a, load(
                base, secret, a, seconds=args.seconds, concurrency=args.concurrency, tokens=args.tokens)))
                for a in ("tiny", "smollm2")]
            for t in threads:
                t.start()
            for t in threads:
                t.join(args.seconds + 600)
            for alias, row in both.items():
                rows[f"{alias} beside the other"] = row
                print(alias, "beside the other", row, flush=True)
            # Re-pointing: smollm2's alias moves to the tiny revision; how soon does a request follow?
            tiny_revision = view.refresh().aliases["tiny"].model_revision
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=300) as client:
                changed = time.monotonic()
                admin.set_alias(view, alias="smollm2", model_revision=tiny_revision, actor="bench")
                while True:
                    answer = client.post("/v1/generations", json={"model_alias": "smollm2", "input": "x",
                                                                  "max_output_tokens": 1, "stream": False}).json()
                    if answer.get("model_revision") == tiny_revision:
                        break
                repoint_ms = (time.monotonic() - changed) * 1000
        print(f"alias re-pointed: the first request on the new revision answered {repoint_ms:.0f} ms after the change")
    finally:
        for service in reversed(services):
            service.stop()
        log.close()
    table = ["| model | phase | output tokens/s | TTFT p50 ms | TTFT p95 ms | requests |", "|---|---|---:|---:|---:|---:|"]
    for name, row in rows.items():
        model, _, phase = name.partition(" ")
        table.append(f"| {model} | {phase} | {row['tokens_per_s']:.1f} | {row['ttft_p50_ms']:.0f} | "
                     f"{row['ttft_p95_ms']:.0f} | {row['requests']} |")
    table.append("")
    table.append(f"Alias re-pointed under no load: the first request on the new revision answered "
                 f"{repoint_ms:.0f} ms after the `ModelAliasSet` was appended (one request, 1 output token).")
    text = "\n".join(table)
    print(text)
    if not args.no_record:
        record_run(SECTION, f"python tests/perf/bench_two_models.py --seconds {args.seconds:g} "
                            f"--concurrency {args.concurrency} --tokens {args.tokens}",
                   f"embedded log; each engine 8 sequences, 0.25 GB KV cache, 512 context, its compute threads on "
                   f"a CPU of its own (tiny 0, SmolLM2 1); {args.concurrency} streams per model, "
                   f"{args.tokens} output tokens each", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
