"""Prefix-cache affinity against plain spreading: TTFT, prefix-cache hits and worker shares.

    .venv/bin/python tests/perf/bench_affinity.py [--workers 4] [--rate 16] [--duration-s 30]

The platform runs in this process on the embedded log (`tests.harness.Platform`), with
`--workers` workers of `--slots` slots each, every one on its own stand-in engine with a
prefix cache (`tests/perf/prefix_engine.py`: vLLM's block hashing, an LRU of
`--cache-blocks` blocks of 64 characters, `--prefill-ms` to compute each block not found,
one prefill at a time, then a token every `--token-ms`). `--tenants` tenants each send
chat requests with a system prompt of their own (`--system-chars` long) and a short
question, streamed, open loop at `--rate` requests a second for `--duration-s`, tenant
chosen at random. The same traffic runs twice on fresh platforms and cold caches: with
`work_affinity` on (requests name their tenant and system prompt; admission places them
by worker, `pipelines.admission.placement`) and off (placed by the request id's hash, as before).
Reported: client TTFT p50/p95/p99, the share of prompt blocks found in the engine's cache,
and the max/min of requests per worker. Then, with affinity on, a burst: `--burst`
requests of one tenant and system prompt sent at once; max/min of requests per worker.
Appends to the "Prefix-cache affinity" section of tests/perf/RESULTS.md (`--no-record`).
"""
from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from models import topics  # noqa: E402
from models.settings import Settings  # noqa: E402
from tests.conftest import make_log_opener  # noqa: E402
from tests.harness import MODEL_ALIAS, Platform  # noqa: E402
from tests.helpers import wait_until  # noqa: E402
from tests.perf.bench_noisy_neighbour import percentile  # noqa: E402
from tests.perf.open_loop import open_loop  # noqa: E402
from tests.perf.prefix_engine import PrefixCachedEngine  # noqa: E402
from tests.perf.results import record_run  # noqa: E402
from workers.engine_runner import EngineRunner  # noqa: E402
from workers.tiny_model import make_tiny_model  # noqa: E402

SECTION = "## Prefix-cache affinity"


def system_prompt(n: int, chars: int) -> str:
    words = random.Random(n).choices(["policy", "invoice", "refund", "order", "account", "shipping", "tax",
                                      "customer", "warranty", "return", "balance", "credit"], k=chars)
    return (f"You are the support assistant of company {n}. " + " ".join(words))[:chars]


class Phase:
    def __init__(self, args, model_dir: Path, *, affinity: bool):
        self.args = args
        self.home = Path(tempfile.mkdtemp(prefix="bench-affinity-"))
        settings = Settings(home=self.home, grace_s=5.0, default_deadline_ms=60_000, decision_timeout_s=20.0,
                            work_affinity=affinity)
        self.engines = [PrefixCachedEngine(pause_s=args.token_ms / 1000, prefill_s_per_block=args.prefill_ms / 1000,
                                           cache_blocks=args.cache_blocks, model_dir=model_dir, max_model_len=4096)
                        for _ in range(args.workers)]
        self.runners = [EngineRunner(e, name=f"prefix-{i}").start() for i, e in enumerate(self.engines)]
        self.platform = Platform(make_log_opener("embedded", self.home), self.runners[0], settings,
                                 max_in_flight=args.slots)
        for runner in self.runners[1:]:
            self.platform.start_worker(runner=runner, revision=self.platform.model_revision, max_in_flight=args.slots)
        normal = topics.work_topic(None, "normal", self.platform.model_revision)

        def owners_known() -> bool:
            owned = [p for w in self.platform.admission.fleet.view.live()
                     for p in (w.work_partitions or {}).get(normal.name, [])]
            return sorted(owned) == list(range(normal.partitions)) and len(
                self.platform.admission.fleet.view.live()) == args.workers
        wait_until(owners_known, 60, what="every worker's heartbeat to name its work partitions")
        self.tenants = [self.platform.tenant()[1] for _ in range(args.tenants)]

    def send(self, secret: str, system: str, question: str) -> float | None:
        """One streamed chat request; its TTFT in ms, None on an error."""
        body = {"model": MODEL_ALIAS, "max_tokens": self.args.output_tokens, "stream": True, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": question}]}
        began = time.perf_counter()
        with self.platform.client(secret) as client, client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return None
            ttft = None
            for line in r.iter_lines():  # to its end, so the request is over when this returns
                if ttft is None and line.startswith("data: {"):
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    if choices[0].get("delta", {}).get("content"):
                        ttft = (time.perf_counter() - began) * 1000
            return ttft

    def owners(self) -> dict[int, str]:
        """Which worker owns each partition of the work topic, as the heartbeats say now."""
        normal = topics.work_topic(None, "normal", self.platform.model_revision).name
        return {p: w.worker_id for w in self.platform.admission.fleet.view.live()
                for p in (w.work_partitions or {}).get(normal, [])}

    def moved(self, before: dict[int, str]) -> int:
        now = self.owners()
        return sum(now.get(p) != w for p, w in before.items())

    def served(self) -> list[int]:
        return [e.requests for e in self.engines]

    def close(self) -> None:
        self.platform.close()
        for runner in self.runners:
            runner.close()


def steady(phase: Phase, args) -> dict:
    rng = random.Random(1)
    systems = [system_prompt(n, args.system_chars) for n in range(args.tenants)]
    total = int(args.rate * args.duration_s)
    owners = phase.owners()

    def one(i: int) -> float | None:
        n = rng.randrange(args.tenants)
        return phase.send(phase.tenants[n], systems[n], f"Question {i}: where is my order?")
    ttfts, errors = open_loop(args.rate, total, one)
    found = sum(e.blocks_found for e in phase.engines)
    computed = sum(e.blocks_computed for e in phase.engines)
    served = phase.served()
    return {"requests": total, "errors": errors, "p50": percentile(ttfts, 0.50), "p95": percentile(ttfts, 0.95),
            "p99": percentile(ttfts, 0.99), "found": found / max(1, found + computed),
            "share": max(served) / max(1, min(served)), "served": served, "moved": phase.moved(owners)}


def burst(phase: Phase, args) -> dict:
    before, owners = phase.served(), phase.owners()
    system = system_prompt(999, args.system_chars)
    with ThreadPoolExecutor(args.burst) as pool:
        ttfts = list(pool.map(lambda i: phase.send(phase.tenants[0], system, f"Burst {i}?"), range(args.burst)))
    served = [a - b for a, b in zip(phase.served(), before)]
    ok = [t for t in ttfts if t is not None]
    return {"served": served, "share": max(served) / max(1, min(served)), "errors": len(ttfts) - len(ok),
            "p95": percentile(ok, 0.95), "moved": phase.moved(owners)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--tenants", type=int, default=12)
    parser.add_argument("--system-chars", type=int, default=2048)
    parser.add_argument("--cache-blocks", type=int, default=96, help="per engine; 32 blocks hold one system prompt")
    parser.add_argument("--prefill-ms", type=float, default=5.0, help="per 64-character block not cached")
    parser.add_argument("--token-ms", type=float, default=15.0)
    parser.add_argument("--output-tokens", type=int, default=8)
    parser.add_argument("--rate", type=float, default=16.0)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--burst", type=int, default=160)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    model_dir = make_tiny_model(Path(tempfile.mkdtemp(prefix="bench-affinity-model-")) / "tiny", seed=0)

    rows, burst_row = {}, None
    for affinity in (True, False):
        phase = Phase(args, model_dir, affinity=affinity)
        try:
            rows[affinity] = steady(phase, args)
            print(("affinity" if affinity else "spread"), rows[affinity], flush=True)
            if affinity:
                burst_row = burst(phase, args)
                print("burst", burst_row, flush=True)
        finally:
            phase.close()
    table = ["| placement | TTFT p50 / p95 / p99 | prompt blocks found cached | requests per worker (max/min) | errors "
             "| partitions that changed owner meanwhile |", "|---|---|---|---|---|---|"]
    for affinity, name in ((True, "affinity (`work_affinity` on)"), (False, "request-id hash (off)")):
        r = rows[affinity]
        table.append(f"| {name} | {r['p50']:.0f} / {r['p95']:.0f} / {r['p99']:.0f} ms | {r['found']:.1%} | "
                     f"{'/'.join(map(str, r['served']))} ({r['share']:.2f}) | {r['errors']} of {r['requests']} | {r['moved']} |")
    table.append(f"| burst of {args.burst}, one tenant and system prompt, affinity on | p95 {burst_row['p95']:.0f} ms "
                 f"| - | {'/'.join(map(str, burst_row['served']))} ({burst_row['share']:.2f}) | "
                 f"{burst_row['errors']} of {args.burst} | {burst_row['moved']} |")
    print("\n".join(table))
    if not args.no_record:
        setup = (f"{args.workers} workers × {args.slots} slots on stand-in engines with a prefix cache of "
                 f"{args.cache_blocks} blocks (64 characters each; {args.prefill_ms:g} ms to compute a block, one "
                 f"prefill at a time; {args.token_ms:g} ms a token, {args.output_tokens} tokens); {args.tenants} "
                 f"tenants, each its own {args.system_chars}-character system prompt; streamed chat at "
                 f"{args.rate:g}/s for {args.duration_s:g} s, open loop; embedded log, in one process")
        command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "tests/perf/bench_affinity.py", *sys.argv[1:]])
        record_run(SECTION, command, setup, "\n".join(table))


if __name__ == "__main__":
    main()
