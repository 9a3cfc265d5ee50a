"""Platform overhead: the same prompts on the same engine, straight into vLLM's AsyncLLM
and through the platform (HTTP → log → admission → worker → log → SSE), on the embedded
log and on Kafka (with `--process-paths`, also as separate processes), in one run.

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/bench_overhead.py [--latency-requests 40] [--seconds 15]

Per path: TTFT and inter-token latency p50/p95 from sequential requests (one at a time,
so the engine is idle and the numbers are the path's own), then output tokens/s at
saturation (`--concurrency` streams kept busy, twice the engine's sequences). For the
platform paths the load comes from a separate client process, as it would in production,
so the client's parsing does not share the platform's interpreter; straight into vLLM the
client is the coroutine on the engine's loop, as the worker's is. Latencies are measured
where the client sees them: request sent to first token; between token arrivals (a
frame carrying n tokens counts as n gaps of 1/n each). Goal: added TTFT p50 ≤ 10 ms,
throughput ≥ 0.85x direct. Appends the table to the "Overhead" section of RESULTS.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.perf.bench_noisy_neighbour import add_worker_options, bench_topics_cleared, log_opener  # noqa: E402
from tests.perf.deployed import CPUS_HELP  # noqa: E402
from tests.perf.results import record_run  # noqa: E402

SECTION = "## Overhead"
MAX_SEQS = 8
LATENCY_TOKENS, SATURATION_TOKENS = 32, 64


def prompt(i: int) -> str:
    return f"Request {i}: tell me everything about the number {i}."


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else float("nan")


def summary(ttft: list[float], gaps: list[float], tokens: int, seconds: float) -> dict:
    return {"ttft_p50_ms": percentile(ttft, 0.5) * 1000, "ttft_p95_ms": percentile(ttft, 0.95) * 1000,
            "itl_p50_ms": percentile(gaps, 0.5) * 1000, "itl_p95_ms": percentile(gaps, 0.95) * 1000,
            "tokens_per_s": tokens / seconds, "requests": len(ttft)}


class Measured:
    """Arrivals of one request's tokens: (time, count) pairs after the send time."""

    def __init__(self):
        self.t0, self.arrivals = time.monotonic(), []

    def tokens(self, count: int) -> None:
        if count:
            self.arrivals.append((time.monotonic(), count))

    def ttft(self) -> float:
        return self.arrivals[0][0] - self.t0

    def gaps(self) -> list[float]:
        out = []
        for (before, _), (at, count) in zip(self.arrivals, self.arrivals[1:]):
            out += [(at - before) / count] * count
        return out


async def drive(one, latency_requests: int, concurrency: int, seconds: float) -> dict:
    """Sequential requests for latency, then `concurrency` loops for `seconds` for throughput."""
    made = 0  # every token the client received, for CPU per token

    async def counted(i: int, max_tokens: int) -> Measured:
        nonlocal made
        m = await one(i, max_tokens)
        made += sum(c for _, c in m.arrivals)
        return m

    for i in range(3):  # warm-up
        await counted(10_000_000 + i, LATENCY_TOKENS)
    runs = [await counted(i, LATENCY_TOKENS) for i in range(latency_requests)]
    latency_end = time.time()
    ttft = [m.ttft() for m in runs]
    gaps = [g for m in runs for g in m.gaps()]
    start, tokens = time.monotonic(), 0
    end = start + seconds

    async def loop(k: int) -> None:
        nonlocal tokens
        i = 0
        while time.monotonic() < end:
            m = await counted(1_000_000 * (k + 1) + i, SATURATION_TOKENS)
            tokens += sum(c for at, c in m.arrivals if at <= end)
            i += 1

    await asyncio.gather(*(loop(k) for k in range(concurrency)))
    return {**summary(ttft, gaps, tokens, seconds), "latency_end": latency_end, "tokens_made": made}


async def direct(llm, args) -> dict:
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    async def one(i: int, max_tokens: int) -> Measured:
        m = Measured()
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        (engine_input,) = await llm.renderer.render_cmpl_async([{"prompt": prompt(i), "cache_salt": "bench"}])
        async for output in llm.generate(engine_input, params, uuid.uuid4().hex):
            m.tokens(len(output.outputs[0].token_ids))
        return m

    return await drive(one, args.latency_requests, args.concurrency, args.seconds)


async def client(base_url: str, key: str, args) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=args.concurrency + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits,
                                 headers={"Authorization": f"Bearer {key}"}) as http:
        async def one(i: int, max_tokens: int) -> Measured:
            body = {"model_alias": "tiny", "input": prompt(i), "max_output_tokens": max_tokens, "ignore_eos": True}
            m = Measured()
            async with http.stream("POST", "/v1/generations", json=body) as response:
                assert response.status_code == 200, await response.aread()
                async for line in response.aiter_lines():
                    if line.startswith("data: {") and '"tokens"' in line:
                        m.tokens(json.loads(line[6:])["token_count"])
            return m

        return await drive(one, args.latency_requests, args.concurrency, args.seconds)


class CpuMeter:
    """CPU seconds of this process, its live children (vLLM's engine processes) and its
    finished children (the client process): what the whole run cost the machine."""

    def __enter__(self):
        self.start = self._now()
        return self

    def __exit__(self, *exc):
        self.seconds = self._now() - self.start

    @staticmethod
    def _now() -> float:
        import resource

        import psutil

        me = psutil.Process()
        total = sum(me.cpu_times()[:2])
        for child in me.children(recursive=True):
            try:
                total += sum(child.cpu_times()[:2])
            except psutil.NoSuchProcess:
                pass
        done = resource.getrusage(resource.RUSAGE_CHILDREN)
        return total + done.ru_utime + done.ru_stime


def with_cpu(row: dict, meter: CpuMeter) -> dict:
    return {**row, "cpu_ms_per_token": meter.seconds * 1000 / max(1, row["tokens_made"])}


def through_platform(path: str, runner, home: Path, args) -> dict:
    from models.settings import Settings
    from tests.harness import Platform

    (home / path).mkdir()
    platform = Platform(log_opener(path, home / path), runner,
                        Settings(home=home / path, grace_s=30.0, default_deadline_ms=300_000,
                                 stream_linger_ms=args.stream_linger_ms),
                        max_in_flight=MAX_SEQS, take_ahead=args.take_ahead)
    try:
        row = measured_client(platform.base_url, *platform.tenant(), platform.admin_log, args)
        platform.check()
        return row
    finally:
        platform.close()


def through_processes(path: str, model: Path, home: Path, args, cpus: str = "auto", pinned: str = "off") -> dict:
    """The platform as deployed (`tests/perf/deployed.py`), its worker with an engine of its
    own, configured as the direct one; `cpus` is `LEDGERLM_CPUS` ("auto": unset), `pinned`
    `LEDGERLM_ENGINE_PINNED` ("on" or "off")."""
    from tests.perf.deployed import cpus_environment, deployed

    log, _, admit = path.partition("+")
    environment = {**cpus_environment(cpus), "LEDGERLM_ENGINE_PINNED": str(int(pinned == "on"))}
    with deployed(log, model, home / f"{path}-processes-{uuid.uuid4().hex[:6]}", max_seqs=MAX_SEQS,
                  take_ahead=args.take_ahead, stream_linger_ms=args.stream_linger_ms, worker_admits=bool(admit),
                  environment=environment) as platform:
        return measured_client(platform.base_url, *platform.tenant(), platform.log, args)


def measured_client(base_url: str, tenant_id: str, key: str, log, args) -> dict:
    """The client process's run against `base_url` as the tenant, with the CPU the whole run
    cost and where its sequential requests' time went on `log`."""
    with CpuMeter() as meter:
        out = subprocess.run([sys.executable, __file__, "--client", base_url, key, *client_args(args)],
                             capture_output=True, text=True, check=True, timeout=900)
    row = with_cpu(json.loads(out.stdout.strip().splitlines()[-1]), meter)
    return {**row, **breakdown(log, tenant_id, row["latency_end"])}


def breakdown(log, tenant_id: str, until: float) -> dict:
    """Where a sequential request's time went, from the log's record stamps (medians, ms):
    request to admission's decision, decision to a worker starting it, start to the first
    token event. The rest of the TTFT is the API (in and out) and the hub."""
    from models import topics

    stamps = first_stamps(log, tenant_id, (topics.REQUESTS, topics.LEDGER, topics.OUTCOMES, topics.STREAM))
    hops = {"admission_ms": ("requests:GenerationRequested", "ledger:BudgetReserved"),
            "to_worker_ms": ("ledger:BudgetReserved", "outcomes:GenerationStarted"),
            "worker_to_first_token_ms": ("outcomes:GenerationStarted", "stream:TokensEmitted")}
    sequential = [s for s in stamps.values() if s.get("requests:GenerationRequested", 0) < until * 1000]
    return {name: percentile([s[b] - s[a] for s in sequential if a in s and b in s], 0.5)
            for name, (a, b) in hops.items()}


def first_stamps(log, tenant_id: str, topic_list) -> dict[str, dict[str, int]]:
    """The record stamp (ms) of the first event of each kind on each topic, by request:
    `{correlation_id: {"ledger:BudgetReserved": ms, ...}}`. Topics keyed by tenant are read
    in the tenant's partition only, the others whole."""
    from models.events import decode
    from pipelines.eventlog import partition_for

    found: dict[str, dict[str, int]] = {}
    for topic in topic_list:
        count = log.partitions(topic.name)
        partitions = [partition_for(tenant_id, count)] if topic.keyed_by == "tenant" else range(count)
        for record in log.read_topic(topic.name, {p: 0 for p in partitions}, page=5000):
            env = decode(record.value)
            if env.tenant_id == tenant_id:
                name = f"{topic.name.rsplit('.', 1)[-1]}:{env.event_type}"
                found.setdefault(env.correlation_id, {}).setdefault(name, record.timestamp_ms)
    return found


def client_args(args) -> list[str]:
    return ["--latency-requests", str(args.latency_requests), "--seconds", str(args.seconds),
            "--concurrency", str(args.concurrency)]


def run(args) -> dict[str, dict]:
    from workers.engine_runner import EngineRunner
    from workers.tiny_model import make_tiny_model
    from workers.vllm_engine import VllmEngine, VllmEngineConfig

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        config = VllmEngineConfig(model=make_tiny_model(home / "tiny", seed=0, shape=args.model), max_model_len=512,
                                  max_num_seqs=MAX_SEQS, kv_cache_gb=0.25)
        runner = EngineRunner(VllmEngine(config), name="bench-engine").start()
        try:
            # Straight into vLLM first and last: the machine is shared, and the two say how
            # much its load moved meanwhile; the platform is compared with their mean.
            with CpuMeter() as meter:
                first = runner.submit(direct(runner.engine._llm, args))  # noqa: SLF001
            direct_runs = [with_cpu(first, meter)]
            rows["straight into vLLM AsyncLLM (first)"] = direct_runs[0]
            for path in args.paths:
                rows[f"through the platform ({path} log)"] = through_platform(path, runner, home, args)
                print(json.dumps(rows), flush=True)
            for path in args.process_paths:
                log, _, admit = path.partition("+")
                runs = [(cpus, pinned) for cpus in args.platform_cpus for pinned in args.engine_pinned]
                for n, (cpus, pinned) in enumerate(runs):
                    name = (f"through the platform as processes ({log} log"
                            f"{', admission in the worker' if admit else ''}"
                            f"{'' if args.platform_cpus == ['auto'] else f', CPUs {cpus}'}"
                            f"{'' if args.engine_pinned == ['off'] else f', engine pinned {pinned}'})")
                    if name in rows:
                        name += f" #{n + 1}"
                    rows[name] = through_processes(path, config.model, home, args, cpus, pinned)
                    print(json.dumps(rows), flush=True)
            with CpuMeter() as meter:
                last = runner.submit(direct(runner.engine._llm, args))  # noqa: SLF001
            direct_runs.append(with_cpu(last, meter))
            rows["straight into vLLM AsyncLLM (last)"] = direct_runs[1]
        finally:
            runner.close()
    return rows


def table(rows: dict[str, dict]) -> str:
    direct = [r for name, r in rows.items() if name.startswith("straight")]
    base = {k: sum(r[k] for r in direct) / len(direct) for k in ("ttft_p50_ms", "tokens_per_s")}
    lines = ["| path | TTFT p50 (ms) | TTFT p95 (ms) | added TTFT p50 (ms) | inter-token p50 (ms) "
             "| inter-token p95 (ms) | output tokens/s at saturation | vs direct (mean) "
             "| CPU ms per output token | admission / to worker / worker to 1st token (ms, p50) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        hops = (f"{r['admission_ms']:.0f} / {r['to_worker_ms']:.0f} / {r['worker_to_first_token_ms']:.0f}"
                if "admission_ms" in r else "-")
        lines.append(f"| {name} | {r['ttft_p50_ms']:.1f} | {r['ttft_p95_ms']:.1f} | "
                     f"{r['ttft_p50_ms'] - base['ttft_p50_ms']:+.1f} | {r['itl_p50_ms']:.2f} | {r['itl_p95_ms']:.2f} | "
                     f"{r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f}x | "
                     f"{r['cpu_ms_per_token']:.2f} | {hops} |")
    return "\n".join(lines)


def record(rows: dict[str, dict], command: str, args) -> None:
    record_run(SECTION, command,
               f"{args.model.capitalize()} model, one vLLM engine (max_num_seqs {MAX_SEQS}, worker take-ahead "
               f"{args.take_ahead}), CPU; {args.latency_requests} sequential requests of {LATENCY_TOKENS} tokens "
               f"for latency, {args.concurrency} streams of {SATURATION_TOKENS}-token requests for "
               f"{args.seconds:.0f} s for throughput", table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--paths", nargs="*", choices=["embedded", "kafka"],
                        default=["embedded", "kafka"])
    parser.add_argument("--model", choices=["tiny", "small"], default="tiny",
                        help="tiny: the engine costs almost nothing per token, so the platform's own cost "
                             "shows in full; small (~40M parameters): compute-bound batches, as with a real model")
    parser.add_argument("--process-paths", nargs="*", choices=["embedded", "kafka", "embedded+admit", "kafka+admit"],
                        default=[],
                        help="also run the platform as separate processes (API, admission, worker with "
                             "its own engine), as deployed, on these logs; +admit: the worker runs admission "
                             "(`serve worker --admit`), so there is no admission process")
    parser.add_argument("--platform-cpus", nargs="+", default=["auto"], metavar="CPUS",
                        help=f"with --process-paths: run each path once per value of LEDGERLM_CPUS, in turn "
                             f"({CPUS_HELP})")
    parser.add_argument("--engine-pinned", nargs="+", default=["off"], choices=["off", "on"],
                        help="with --process-paths: run each path once per value of LEDGERLM_ENGINE_PINNED, in "
                             "turn (on: the worker keeps all of vLLM's processes on its compute CPUs)")
    parser.add_argument("--latency-requests", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=2 * MAX_SEQS)
    add_worker_options(parser)
    parser.add_argument("--client", nargs=2, metavar=("BASE_URL", "KEY"), help=argparse.SUPPRESS)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if args.client:
        print(json.dumps(asyncio.run(client(*args.client, args))))
        return
    with bench_topics_cleared(*args.paths, *(p.partition("+")[0] for p in args.process_paths)):
        rows = run(args)
    print(table(rows))
    if not args.no_record:
        record(rows, ".venv/bin/python tests/perf/bench_overhead.py " + shlex.join(sys.argv[1:]), args)


if __name__ == "__main__":
    main()
