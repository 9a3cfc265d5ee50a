"""The data plane's ceiling: output tokens carried per CPU core of the platform's own
processes, with an engine that costs next to nothing (workers/synthetic_engine.py), at a fixed
number of streams, on the embedded log and on Kafka; beside it, the front end of vLLM's own
OpenAI server (its API process, the engine core apart) and the platform's processes on a
vLLM engine, both on the tiny model at the same number of streams.

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/bench_data_plane.py [--targets embedded kafka vllm embedded-vllm kafka-vllm]
        [--streams 64 256] [--duration 20] [--tokens-per-s 50] [--profile DIR]

Each target and stream count is one run of `tests/perf/loadtest_workload_data_plane.yaml`
(streams of 64 output tokens, each sending the next request when the last ends). CPU is
read from the processes (user + system), so the figures hold on a loaded host better than
wall-clock rates do: tokens per platform CPU-second is tokens/s per core. `--profile DIR`
records each platform process with py-spy during the run, counting only samples that hold
the GIL (collapsed stacks per process: `tests/perf/stacks.py` sums them by function).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.perf.bench_loadtest_side_by_side import CpuSplit, serving_pids, vllm_server  # noqa: E402
from tests.perf.results import record_run  # noqa: E402

SECTION = "## Data plane: tokens per platform core"
WORKLOAD = Path(__file__).with_name("loadtest_workload_data_plane.yaml")
# The synthetic engine on each log; vLLM's own server; the platform on vLLM (tiny model).
TARGETS = ["embedded", "kafka", "vllm", "embedded-vllm", "kafka-vllm"]
KEY_VARS = ("LOADTEST_KEY_A", "LOADTEST_KEY_B", "LOADTEST_KEY_C", "LOADTEST_KEY_D")


@contextmanager
def platform_server(target: str, home: Path, streams: int, args):
    """The platform as deployed with a seat for every stream: on the synthetic engine
    (`embedded`, `kafka`), or on vLLM with the tiny model (`embedded-vllm`, `kafka-vllm`)."""
    from tests.perf.deployed import deployed
    from workers.tiny_model import make_tiny_model

    log, _, engine = target.partition("-")
    # The API counts prompt tokens with the model directory's tokenizer; the synthetic engine
    # reads nothing else from it.
    model = make_tiny_model(home / "tiny", seed=0, shape="tiny")
    env = {"LEDGERLM_KV_CACHE_GB": str(args.kv_cache_gb)}
    if engine != "vllm":
        env.update({"LEDGERLM_ENGINE_FACTORY": "workers.synthetic_engine:SyntheticEngine.from_settings",
                    "LEDGERLM_PACED_TOKENS_PER_S": str(args.tokens_per_s), "LEDGERLM_PACED_MAX_SEQS": str(streams),
                    "LEDGERLM_ENGINE_STATS": "0"})
    with deployed(log, model, home / f"platform-{target}-{streams}", max_seqs=streams, take_ahead=0,
                  stream_linger_ms=args.stream_linger_ms, environment=env) as platform:
        keys = {var: platform.tenant()[1] for var in KEY_VARS}
        yield platform.base_url, serving_pids(), keys


@contextmanager
def profiled(pids: list[int], out: Path | None, seconds: float):
    """py-spy records each process for `seconds` when `out` is given."""
    spies = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        spy = Path(sys.executable).with_name("py-spy")
        for pid in pids:
            role = _role(pid)
            spies.append(subprocess.Popen([str(spy), "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "100", "--gil",
                                           "--format", "raw", "-o", str(out / f"{role}-{pid}.txt"), "--nonblocking"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        yield
    finally:
        for spy in spies:
            try:
                spy.wait(timeout=seconds + 30)
            except subprocess.TimeoutExpired:
                spy.kill()


def _role(pid: int) -> str:
    import psutil

    from tests.perf.deployed import role_of

    try:
        return role_of(psutil.Process(pid).cmdline()) or "process"
    except psutil.NoSuchProcess:
        return "gone"


def run_one(name: str, server, streams: int, args, profile: Path | None) -> dict:
    from api.loadtest import load, run
    from api.loadtest.workload import Mode

    with server as (base, pids, keys):
        os.environ.update(keys or {var: "none" for var in KEY_VARS})
        if args.warmup > 0:
            warm = load(WORKLOAD)
            warm.mode = Mode(kind="concurrency", concurrency=min(streams, 16), duration_s=args.warmup)
            run(warm, base, show_progress=False, timeout_s=args.timeout)
        workload = load(WORKLOAD)
        workload.mode = Mode(kind="concurrency", concurrency=streams, duration_s=args.duration)
        split = CpuSplit(pids)
        per_process = {pid: _cpu(pid) for pid in pids}
        with profiled(pids, profile and profile / f"{name}-{streams}", args.duration):
            result = run(workload, base, target_name=name, timeout_s=args.timeout, show_progress=False)
        front, engine = split.spent()
        per_process = {_role(pid): round(_cpu(pid) - before, 3) for pid, before in per_process.items()}
    [step] = result["steps"]
    tokens = step["output_tokens_per_s"] * step["duration_s"]
    # The synthetic engine runs inside the worker's process, so there "cpu" is every process;
    # vLLM's engine core is a child of its server or of the worker, counted apart as "engine".
    row = {"target": name, "streams": streams, "output_tokens": round(tokens),
           "output_tokens_per_s": round(step["output_tokens_per_s"], 1), "cpu_s": round(front, 3),
           "engine_cpu_s": round(engine, 3), "per_process_cpu_s": per_process,
           "tokens_per_core_s": round(tokens / front) if front else None,
           "cpu_us_per_token": round(front * 1e6 / tokens, 1) if tokens else None,
           "ttft_p50_ms": step["ttft_ms"]["p50"], "tpot_p50_ms": step["tpot_ms"]["p50"],
           "rejections": step["rejections"], "failures": step["failures"]}
    print(json.dumps(row), flush=True)
    return row


def _cpu(pid: int) -> float:
    import psutil

    try:
        return sum(psutil.Process(pid).cpu_times()[:2])
    except psutil.NoSuchProcess:
        return 0.0


def table(rows: list[dict]) -> str:
    lines = ["| target | streams | output tokens/s carried | platform CPU s (per process) | tokens/s per core "
             "| CPU µs per token | TTFT p50 / TPOT p50 (ms) | rejections / failures |",
             "|---|---:|---:|---|---:|---:|---:|---|"]
    for r in rows:
        procs = ", ".join(f"{k} {v:.1f}" for k, v in r["per_process_cpu_s"].items())
        lines.append(f"| {r['target']} | {r['streams']} | {r['output_tokens_per_s']:.0f} | {r['cpu_s']:.1f} ({procs}) "
                     f"| {r['tokens_per_core_s'] or '-'} | {r['cpu_us_per_token'] or '-'} "
                     f"| {r['ttft_p50_ms'] or 0:.0f} / {r['tpot_p50_ms'] or 0:.1f} "
                     f"| {sum(r['rejections'].values())} / {r['failures']} |")
    return "\n".join(lines)


def main() -> int:
    from tests.perf.bench_noisy_neighbour import bench_topics_cleared

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=["embedded", "kafka"])
    parser.add_argument("--streams", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--tokens-per-s", type=float, default=50.0, help="each stream's rate on the synthetic engine")
    parser.add_argument("--stream-linger-ms", type=float, default=None,
                        help="how long a generation's later tokens may wait to share a stream event (as deployed)")
    parser.add_argument("--kv-cache-gb", type=float, default=0.5, help="the vLLM engines only")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--profile", type=Path, default=None, help="a folder for py-spy stacks")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if args.stream_linger_ms is None:
        from models.settings import Settings

        args.stream_linger_ms = Settings().stream_linger_ms

    home = Path(tempfile.mkdtemp(prefix="data-plane-"))
    rows = []
    with bench_topics_cleared(*args.targets):
        for streams in args.streams:
            for name in args.targets:
                if name == "vllm":
                    from workers.tiny_model import make_tiny_model

                    model = make_tiny_model(home / "tiny", seed=0, shape="tiny")
                    server = vllm_server(model, home, args.kv_cache_gb, max_seqs=streams)
                else:
                    server = platform_server(name, home, streams, args)
                rows.append(run_one(name, server, streams, args, args.profile))
    text = table(rows)
    print(text)
    if not args.no_record:
        record_run(SECTION, ".venv/bin/python tests/perf/bench_data_plane.py " + shlex.join(sys.argv[1:]),
                   f"Paced stand-in engine, {args.tokens_per_s:g} tokens/s a stream, a seat per stream, take-ahead 0, "
                   f"stream linger {args.stream_linger_ms:g} ms; workload {WORKLOAD.name}, {args.duration:g} s a run; "
                   "client in the bench process (its CPU not counted); `vllm`: vLLM's API server process alone, "
                   "`*-vllm`: the platform's processes on a vLLM engine (its engine core apart), both the tiny model", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
