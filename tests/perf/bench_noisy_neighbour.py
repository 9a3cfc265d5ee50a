"""Noisy neighbour: does a flood from tenant A delay tenant B's first token?

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/bench_noisy_neighbour.py --log embedded --seconds 20

The platform runs as deployed: `ledgerlm serve api`, `ledgerlm serve admission` and
`python -m workers serve worker` (an engine of its own), each a process (`--in-process`:
as threads of this process on the bench's engine, as the tests run it). The clients are a
process of their own too. Each run has these phases, all with the tiny model and
max_num_seqs 8:

1. unloaded: B alone through the platform, a trickle of streaming requests;
2. flood through the platform: A keeps 10x its fair share in flight (fair share = half the
   engine's sequences with two tenants busy, so 40 requests of 32 tokens), B trickles on;
3. B alone straight into vLLM AsyncLLM, and the same flood and trickle straight into it,
   all at one priority, so the engine serves first come, first served;
4. the flood and trickle straight into vLLM as an ideal scheduler with no cost of its own
   would send them: B ahead in vLLM's priority, A on all seats but one. The floor of what
   any platform in front of this engine could reach.

B's TTFT is measured by the client: from sending the request to its first token. The
goal is B's p95 under the flood through the platform within 1.5x its unloaded p95. For
the platform phases the log tells where the time went: request to first token written
(the rest is the API delivering it), and of that the part spent in admission (request to
queued) and queued for a worker (queued to started; the rest is the engine's first token).
Prints a table and appends it, with the command, to the "Noisy neighbour" section of
tests/perf/RESULTS.md (`--no-record` to skip).

`--switch-interval-ms 5 1 --rounds 3` runs the platform phases once per interpreter switch
interval (`LEDGERLM_SWITCH_INTERVAL_MS`), alternating, three times over: each flood is
compared with the unloaded run of its own platform. `--cpus auto all` does the same for
where the platform's processes run (`LEDGERLM_CPUS`).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from models import topics  # noqa: E402
from models.events import decode  # noqa: E402
from models.settings import Settings  # noqa: E402
from tests.perf.deployed import CPUS_HELP, cpus_environment  # noqa: E402
from tests.perf.results import record_run  # noqa: E402
from workers.engine import EngineRequest  # noqa: E402
from workers.engine_runner import EngineRunner  # noqa: E402
from workers.tiny_model import make_tiny_model  # noqa: E402
from workers.vllm_engine import VllmEngine, VllmEngineConfig  # noqa: E402

SECTION = "## Noisy neighbour"
MAX_SEQS = 8
FLOOD = 10 * (MAX_SEQS // 2)  # ten times a fair share of two busy tenants
A_TOKENS, B_TOKENS = 32, 8


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else float("nan")


def _events(log, topic, tenant_id: str, since: datetime):
    for env in (decode(r.value) for r in log.read_topic(topic.name, page=5000)):
        if env.tenant_id == tenant_id and env.occurred_at >= since:
            yield env


def b_breakdown(log, tenant_id: str, since: datetime) -> dict:
    """Where B's time went, from B's events on the log: request to first token written
    (the rest of the client's TTFT is the API delivering it), and of that, admission's
    decision (queueing it, or with `--worker-admits` taking it at once) and the time queued
    for the worker (admission queueing it to the worker starting it)."""
    requested = {e.correlation_id: e.occurred_at for e in _events(log, topics.REQUESTS, tenant_id, since)
                 if e.event_type == "GenerationRequested"}
    first: dict[str, datetime] = {}
    for env in _events(log, topics.STREAM, tenant_id, since):
        if env.event_type == "TokensEmitted" and env.correlation_id not in first:
            first[env.correlation_id] = env.occurred_at
    on_log = [(first[r] - requested[r]).total_seconds() * 1000 for r in first if r in requested]
    starts = [e for e in _events(log, topics.OUTCOMES, tenant_id, since) if e.event_type == "GenerationStarted"]
    queued = [e.payload.queued_ms for e in starts]
    decided = {e.correlation_id: e.payload.queued_at for e in _events(log, topics.WORK_NORMAL, tenant_id, since)
               if e.event_type == "GenerationQueued"}
    for e in starts:  # taken in admission's own commit (`--worker-admits`): never queued
        decided.setdefault(e.correlation_id, e.occurred_at)
    admitted = [(at - requested[r]).total_seconds() * 1000 for r, at in decided.items() if r in requested]
    engine = [e.payload.timings.ttft_ms for e in _events(log, topics.OUTCOMES, tenant_id, since)
              if e.event_type == "GenerationCompleted" and e.payload.timings.ttft_ms is not None]
    return {"b_first_token_on_log_p95_ms": percentile(on_log, 0.95), "b_admission_p95_ms": percentile(admitted, 0.95),
            "b_queued_p95_ms": percentile(queued, 0.95), "b_engine_ttft_p95_ms": percentile(engine, 0.95)}


@contextmanager
def bench_topics_cleared(*logs: str):
    """Deletes the benchmarks' Kafka topics (namespaces `bench...`) before and after the
    run when it uses Kafka: left behind, thousands of partitions slow the broker down."""
    from tests.kafka_cleanup import delete_prefixed

    url = os.environ.get("LEDGERLM_TEST_KAFKA", "") if "kafka" in logs else ""
    if url:
        delete_prefixed(url, "bench")
    try:
        yield
    finally:
        if url:
            delete_prefixed(url, "bench")


def log_opener(kind: str, home: Path):
    """The embedded log under `home`, or a fresh namespace on the Kafka of LEDGERLM_TEST_KAFKA."""
    from tests.harness import isolated_log_opener

    return isolated_log_opener(kind, home, kafka_url=os.environ.get("LEDGERLM_TEST_KAFKA", ""), prefix="bench")


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    """The pool worker's settings both platform benchmarks vary, at their deployed defaults."""
    parser.add_argument("--take-ahead", type=int, default=MAX_SEQS,
                        help="generations the pool worker starts beyond the engine's capacity (as deployed: the capacity)")
    parser.add_argument("--stream-linger-ms", type=float, default=Settings().stream_linger_ms,
                        help="how long a generation's later tokens may wait to share a stream event (as deployed)")


class Trickle:
    """B: one streaming request every `every_s`, TTFT of each, until stopped."""

    def __init__(self, every_s: float):
        self.every_s, self.ttft_ms, self.tasks = every_s, [], []

    async def run(self, one, seconds: float) -> None:
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            self.tasks.append(asyncio.ensure_future(one(i)))
            i += 1
            await asyncio.sleep(self.every_s)  # the load generator's clock, not synchronisation
        await asyncio.gather(*self.tasks)


async def flood(one, seconds: float) -> int:
    """A: FLOOD requests in flight at all times; returns how many completed."""
    end, done = time.monotonic() + seconds, 0

    async def loop(k: int) -> None:
        nonlocal done
        i = 0
        while time.monotonic() < end:
            await one(k * 100_000 + i)
            done += 1
            i += 1

    await asyncio.gather(*(loop(k) for k in range(FLOOD)))
    return done


async def platform_phase(base_url: str, a_key: str, b_key: str, seconds: float, every_s: float, with_flood: bool):
    limits = httpx.Limits(max_connections=FLOOD + 50, max_keepalive_connections=FLOOD + 50)
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as client:
        async def b_request(i: int) -> None:
            body = {"model_alias": "tiny", "input": f"B asks question {i}", "max_output_tokens": B_TOKENS,
                    "ignore_eos": True, "stream": True}
            t0 = time.monotonic()
            async with client.stream("POST", "/v1/generations", json=body,
                                     headers={"Authorization": f"Bearer {b_key}"}) as response:
                first = None
                async for line in response.aiter_lines():
                    if first is None and line.startswith("data: ") and '"tokens"' in line:
                        first = (time.monotonic() - t0) * 1000
                trickle.ttft_ms.append(first if first is not None else float("nan"))

        async def a_request(i: int) -> None:
            body = {"model_alias": "tiny", "input": f"A floods {i}", "max_output_tokens": A_TOKENS,
                    "ignore_eos": True, "stream": False}
            await client.post("/v1/generations", json=body, headers={"Authorization": f"Bearer {a_key}"})

        trickle = Trickle(every_s)
        jobs = [trickle.run(b_request, seconds)] + ([flood(a_request, seconds)] if with_flood else [])
        results = await asyncio.gather(*jobs)
        return trickle.ttft_ms, (results[1] if with_flood else 0)


async def direct_phase(engine, seconds: float, every_s: float, with_flood: bool, scheduled: bool = False):
    """Straight into the engine. `scheduled`: what an ideal scheduler with no cost of its own
    would do, B ahead of A in vLLM's priority and A held to all but one of the engine's
    sequences (the platform's last-slot rule); otherwise first come, first served."""
    a_seats = asyncio.Semaphore(MAX_SEQS - 1 if scheduled else FLOOD)

    async def generate(tenant: str, prompt: str, tokens: int) -> float | None:
        t0, first = time.monotonic(), None
        request = EngineRequest(request_id=uuid.uuid4().hex, prompt=prompt, max_output_tokens=tokens,
                                tenant_id=tenant, priority=0 if scheduled and tenant == "tenant-b" else 1,
                                ignore_eos=True)
        async for delta in engine.generate(request):
            if first is None and delta.new_tokens:
                first = (time.monotonic() - t0) * 1000
        return first

    trickle = Trickle(every_s)

    async def b_request(i: int) -> None:
        trickle.ttft_ms.append(await generate("tenant-b", f"B asks question {i}", B_TOKENS))

    async def a_request(i: int) -> None:
        async with a_seats:
            await generate("tenant-a", f"A floods {i}", A_TOKENS)

    jobs = [trickle.run(b_request, seconds)] + ([flood(a_request, seconds)] if with_flood else [])
    results = await asyncio.gather(*jobs)
    return trickle.ttft_ms, (results[1] if with_flood else 0)


def client_phase(base_url: str, a_key: str, b_key: str, seconds: float, every_s: float, with_flood: bool):
    """One platform phase from a client process of its own, as clients are in production:
    the load generator's parsing never shares the platform's interpreter lock."""
    argv = [sys.executable, __file__, "--client", base_url, a_key, b_key, "--seconds", str(seconds),
            "--every", str(every_s)] + (["--flood"] if with_flood else [])
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=seconds + 300)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["ttft_ms"], result["a_done"]


@contextmanager
def platform_under_test(args, runner, model: Path, home: Path, environment: dict[str, str]):
    """(base URL, a log handle on the platform's log, tenant factory): in this process on the
    bench's engine, or (`--processes`) as deployed, the worker with an engine of its own
    and `environment` added to the processes' own."""
    if args.processes:
        from tests.perf.deployed import deployed

        with deployed(args.log, model, home, max_seqs=MAX_SEQS, take_ahead=args.take_ahead,
                      stream_linger_ms=args.stream_linger_ms, worker_admits=args.worker_admits,
                      environment=environment) as platform:
            yield platform.base_url, platform.log, platform.tenant
        return
    from tests.harness import Platform

    settings = Settings(home=home, grace_s=30.0, default_deadline_ms=300_000, stream_linger_ms=args.stream_linger_ms)
    platform = Platform(log_opener(args.log, home), runner, settings, max_in_flight=MAX_SEQS,
                        take_ahead=args.take_ahead, worker_admits=args.worker_admits)
    try:
        yield platform.base_url, platform.admin_log, platform.tenant
        platform.check()
    finally:
        platform.close()


def variants(args) -> list[tuple[str, dict[str, str]]]:
    """(label, environment) of each platform to run: one, or with `--switch-interval-ms` or
    `--cpus` one per value, alternating for `--rounds`."""
    if args.cpus:
        return [(f", CPUs {cpus}, round {r + 1}", cpus_environment(cpus))
                for r in range(args.rounds) for cpus in args.cpus]
    if not args.switch_interval_ms:
        return [("", {})]
    return [(f", switch interval {ms:g} ms, round {r + 1}", {"LEDGERLM_SWITCH_INTERVAL_MS": str(ms)})
            for r in range(args.rounds) for ms in args.switch_interval_ms]


def run(args) -> list[dict]:
    rows = []
    where = f"{args.log}{', as processes' if args.processes else ', in one process'}"

    def measure(name: str, phase, log=None, b_id: str = "") -> None:
        since = datetime.now(timezone.utc)
        ttft, a_done = phase()
        ttft = [t for t in ttft if t == t]
        rows.append({"phase": name, "b_requests": len(ttft), "b_ttft_p50_ms": percentile(ttft, 0.5),
                     "b_ttft_p95_ms": percentile(ttft, 0.95), "a_completed_per_s": a_done / args.seconds})
        if log is not None:
            rows[-1].update(b_breakdown(log, b_id, since))
        print(json.dumps(rows[-1]), flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        model = make_tiny_model(home / "tiny", seed=0)
        runner = EngineRunner(VllmEngine(VllmEngineConfig(model=model, max_model_len=512, max_num_seqs=MAX_SEQS,
                                                          kv_cache_gb=0.25)), name="bench-engine").start()
        try:
            for n, (label, environment) in enumerate(variants(args)):
                with platform_under_test(args, runner, model, home / f"deployed{n}", environment) as (
                        base_url, log, new_tenant):
                    (_, a_key), (b_id, b_key) = new_tenant(), new_tenant()
                    client_phase(base_url, a_key, b_key, 3, 0.25, True)  # warm-up
                    for flood, name in ((False, "B alone"), (True, "A flood + B")):
                        measure(f"{name}, through the platform ({where}{label})",
                                lambda: client_phase(base_url, a_key, b_key, args.seconds, args.every, flood),
                                log, b_id)
            measure("B alone, straight to vLLM",
                    lambda: runner.submit(direct_phase(runner.engine, args.seconds, args.every, False)))
            measure("A flood + B, straight to vLLM (FCFS)",
                    lambda: runner.submit(direct_phase(runner.engine, args.seconds, args.every, True)))
            measure("A flood + B, straight to vLLM, ideally scheduled (B first, A on all seats but one)",
                    lambda: runner.submit(direct_phase(runner.engine, args.seconds, args.every, True, scheduled=True)))
        finally:
            runner.close()
    return rows


def table(rows: list[dict]) -> str:
    base = rows[0]["b_ttft_p95_ms"]
    lines = ["| phase | B requests | B TTFT p50 (ms) | B TTFT p95 (ms) | p95 / unloaded | B first token on the log "
             "p95 (ms) | B admission p95 (ms) | B queued for a worker p95 (ms) | B engine TTFT p95 (ms) | A completed/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row["phase"].startswith("B alone, through the platform"):
            base = row["b_ttft_p95_ms"]  # each platform's flood against its own unloaded run
        inside = (f"{row['b_first_token_on_log_p95_ms']:.0f} | {row['b_admission_p95_ms']:.0f} | "
                  f"{row['b_queued_p95_ms']:.0f} | {row['b_engine_ttft_p95_ms']:.0f}" if "b_queued_p95_ms" in row
                  else "- | - | - | -")
        lines.append(f"| {row['phase']} | {row['b_requests']} | {row['b_ttft_p50_ms']:.0f} | "
                     f"{row['b_ttft_p95_ms']:.0f} | {row['b_ttft_p95_ms'] / base:.2f}x | {inside} | "
                     f"{row['a_completed_per_s']:.1f} |")
    return "\n".join(lines)


def record(rows: list[dict], command: str, args) -> None:
    record_run(SECTION, command,
               f"Tiny model, one vLLM engine (max_num_seqs {MAX_SEQS}, worker take-ahead {args.take_ahead}); "
               f"A keeps {FLOOD} requests of {A_TOKENS} tokens in flight, B sends one of {B_TOKENS} tokens every "
               f"{args.every * 1000:.0f} ms for {args.seconds:.0f} s", table(rows), heading=f" ({args.log} log{', as processes' if args.processes else ', in one process'}"
                       f"{', admission in the worker' if args.worker_admits else ''})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log", choices=["embedded", "kafka"], default="embedded")
    parser.add_argument("--worker-admits", action="store_true",
                        help="the worker runs admission (`serve worker --admit`): no admission of its own")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--in-process", dest="processes", action="store_false",
                        help="run the platform's parts as threads of this process on the bench's engine, as the "
                             "tests do, instead of as deployed (API, admission and a worker with its own engine, "
                             "each a process)")
    parser.add_argument("--every", type=float, default=0.25, help="seconds between B's requests")
    add_worker_options(parser)
    parser.add_argument("--switch-interval-ms", type=float, nargs="+",
                        help="run the platform once per value of LEDGERLM_SWITCH_INTERVAL_MS, side by side")
    parser.add_argument("--cpus", nargs="+", metavar="CPUS",
                        help=f"run the platform once per value of LEDGERLM_CPUS, side by side ({CPUS_HELP})")
    parser.add_argument("--rounds", type=int, default=1, help="with --switch-interval-ms or --cpus: how many times over")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--client", nargs=3, metavar=("BASE_URL", "A_KEY", "B_KEY"), help=argparse.SUPPRESS)
    parser.add_argument("--flood", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if (args.switch_interval_ms or args.cpus) and not args.processes:
        parser.error("--switch-interval-ms and --cpus need the platform as processes")
    if args.switch_interval_ms and args.cpus:
        parser.error("vary one thing at a time: --switch-interval-ms or --cpus")
    if args.client:
        ttft, a_done = asyncio.run(platform_phase(*args.client, args.seconds, args.every, args.flood))
        print(json.dumps({"ttft_ms": ttft, "a_done": a_done}))
        return
    with bench_topics_cleared(args.log):
        rows = run(args)
    print(table(rows))
    if not args.no_record:
        record(rows, ".venv/bin/python tests/perf/bench_noisy_neighbour.py " + shlex.join(sys.argv[1:]), args)


if __name__ == "__main__":
    main()
