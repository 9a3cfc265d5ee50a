"""Where a saturated platform's CPU goes, process by process, with stream lingers side by side.

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/cpu_split.py --model small --linger-ms 10 40 10 40

For each linger in turn: the platform as deployed (`tests/perf/deployed.py`: admission,
the worker with its own engine, the API), the overhead bench's client keeping
`--concurrency` streams of 64-token requests busy for `--seconds`, and the CPU seconds each
process used meanwhile (the client's own, too). Repeating a linger (10 40 10 40) shows
how much of a difference is the machine. Prints a table; records nothing.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.perf.bench_noisy_neighbour import bench_topics_cleared  # noqa: E402
from tests.perf.deployed import role_of  # noqa: E402

OVERHEAD = ROOT / "tests" / "perf" / "bench_overhead.py"


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """{pid: (role, CPU seconds)} of this process's descendants."""
    import psutil

    found = {}
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = child.cmdline()
            role = ("engine " + child.name() if "VLLM" in child.name() or "VLLM" in " ".join(cmdline) else
                    role_of(cmdline))
            if role:
                found[child.pid] = (role, sum(child.cpu_times()[:2]))
        except psutil.NoSuchProcess:
            pass
    return found


def one_run(path: str, model: Path, home: Path, linger_ms: float, args) -> dict:
    from tests.perf.deployed import deployed

    with deployed(path, model, home, max_seqs=8, take_ahead=8, stream_linger_ms=linger_ms) as platform:
        _, key = platform.tenant()
        before = cpu_by_process()
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([sys.executable, str(OVERHEAD), "--client", platform.base_url, key,
                              "--latency-requests", "1", "--seconds", str(args.seconds),
                              "--concurrency", str(args.concurrency)],
                             capture_output=True, text=True, check=True, timeout=600)
        after = cpu_by_process()
        children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    cpu: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        cpu[role] = cpu.get(role, 0.0) + seconds - before.get(pid, (role, 0.0))[1]
    cpu["client"] = (children_after.ru_utime + children_after.ru_stime
                     - children_before.ru_utime - children_before.ru_stime)
    return {"linger_ms": linger_ms, "tokens_per_s": row["tokens_per_s"], "tokens": row["tokens_made"], "cpu": cpu}


def table(runs: list[dict]) -> str:
    roles = ["admission", "worker", "api", "client"]
    lines = ["| linger (ms) | tokens/s | " + " | ".join(f"{r} CPU s (ms/token)" for r in roles) + " | engine CPU s |",
             "|---:|---:|" + "---:|" * len(roles) + "---:|"]
    for run in runs:
        cells = [f"{run['cpu'].get(r, 0.0):.2f} ({run['cpu'].get(r, 0.0) * 1000 / max(1, run['tokens']):.3f})"
                 for r in roles]
        engine = sum(v for k, v in run["cpu"].items() if k.startswith("engine"))
        lines.append(f"| {run['linger_ms']:g} | {run['tokens_per_s']:.0f} | " + " | ".join(cells) + f" | {engine:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log", choices=["embedded", "kafka"], default="embedded")
    parser.add_argument("--model", choices=["tiny", "small"], default="small")
    parser.add_argument("--linger-ms", type=float, nargs="+", default=[10.0, 40.0, 10.0, 40.0])
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    from workers.tiny_model import make_tiny_model

    runs = []
    with tempfile.TemporaryDirectory() as tmp, bench_topics_cleared(args.log):
        home = Path(tmp)
        model = make_tiny_model(home / "model", seed=0, shape=args.model)
        for i, linger in enumerate(args.linger_ms):
            runs.append(one_run(args.log, model, home / f"run{i}", linger, args))
            print(json.dumps(runs[-1]), flush=True)
    print(table(runs))


if __name__ == "__main__":
    main()
