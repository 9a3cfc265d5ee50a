"""How long an API request waits to learn whether the admin topic changed, with many
requests at once: one look at the topic's end per request (as before), against callers that
arrive during a look sharing the next one (`RegistryView.refresh` now).

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/bench_registry.py [--log kafka] [--seconds 3]

Each of N threads calls `refresh()` every 2-6 ms, as request handlers would; both ways run
alternately on the same log handle. Prints a table and appends it to the "Registry"
section of RESULTS.md (`--no-record` to skip).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipelines.admin.commands import Registry, RegistryView  # noqa: E402
from tests.harness import isolated_log_opener  # noqa: E402
from tests.perf.results import record_run  # noqa: E402

SECTION = "## Registry"


class OneLookPerCall(RegistryView):
    """The view as it was: every call makes its own look, one at a time."""

    def refresh(self, timeout_s: float = 0.0) -> Registry:
        with self._lock:
            return self._catch_up(timeout_s)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(view: RegistryView, threads: int, seconds: float) -> dict:
    stop = time.monotonic() + seconds
    waits: list[float] = []

    def caller(i: int) -> None:
        mine = []
        while time.monotonic() < stop:
            time.sleep(0.002 + (i % 5) * 0.001)
            began = time.perf_counter()
            view.refresh()
            mine.append(time.perf_counter() - began)
        waits.extend(mine)
    checks = view.checks
    workers = [threading.Thread(target=caller, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(seconds + 60)
    return {"calls_per_s": len(waits) / seconds, "looks_per_s": (view.checks - checks) / seconds,
            "p50_ms": percentile(waits, 0.5) * 1000, "p95_ms": percentile(waits, 0.95) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log", choices=["embedded", "kafka"], default="kafka")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        opener = isolated_log_opener(args.log, Path(tmp), kafka_url=os.environ.get("LEDGERLM_TEST_KAFKA", ""),
                                     prefix="benchreg")
        log = opener()
        try:
            for threads in args.threads:
                for name, kind in (("one look per call", OneLookPerCall), ("shared looks", RegistryView)):
                    view = kind(log)
                    view.refresh()
                    rows.append({"threads": threads, "way": name, **measure(view, threads, args.seconds)})
                    view.close()
        finally:
            log.close()
    lines = ["| callers | way | calls/s | looks/s | wait p50 (ms) | wait p95 (ms) |", "|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {r['threads']} | {r['way']} | {r['calls_per_s']:.0f} | {r['looks_per_s']:.0f} | {r['p50_ms']:.2f} | "
              f"{r['p95_ms']:.2f} |" for r in rows]
    table = "\n".join(lines)
    print(table)
    if not args.no_record:
        record_run(SECTION, ".venv/bin/python tests/perf/bench_registry.py " + shlex.join(sys.argv[1:]),
                   f"{args.log.capitalize()} log; each caller refreshes every 2-6 ms for {args.seconds:g} s", table)


if __name__ == "__main__":
    main()
