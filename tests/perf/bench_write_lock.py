"""Appends to the embedded log from several processes at once: the latency of one append
when the write lock is taken by `take_write_lock` (retries every 0.1-1 ms) and when SQLite's
own busy handler waits for it (sleeps of 1, 2, 5, 10, ... ms), alternating in one run.

    .venv/bin/python tests/perf/bench_write_lock.py [--processes 3] [--seconds 6] [--rounds 2]

Each process appends one 200-byte record, pauses 1 ms, and repeats. Appends to the "Event
log" section of tests/perf/RESULTS.md (`--no-record` to skip).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.perf.results import record_run  # noqa: E402

SECTION = "## Event log"
MODES = {"retry": "take_write_lock (sub-millisecond retries)", "sqlite": "SQLite's busy handler"}


def appender(path: str, mode: str, seconds: float, out: mp.Queue) -> None:
    import pipelines.eventlog.embedded_store as store
    from pipelines.eventlog.base import Message
    from pipelines.eventlog.embedded import EmbeddedEventLog

    if mode == "sqlite":  # the connection's busy timeout does the waiting
        store.take_write_lock = lambda conn: conn.execute("BEGIN IMMEDIATE")
    log = EmbeddedEventLog(path)
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.perf_counter()
        log.append("t", [Message("k", b"x" * 200)])
        latencies.append(time.perf_counter() - began)
        time.sleep(0.001)
    log.close()
    out.put(latencies)


def measure(mode: str, processes: int, seconds: float) -> dict:
    from pipelines.eventlog.base import TopicSpec
    from pipelines.eventlog.embedded import EmbeddedEventLog

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "log.db")
        with EmbeddedEventLog(path) as log:
            log.ensure_topics([TopicSpec("t", 1)])
        out: mp.Queue = mp.Queue()
        workers = [mp.Process(target=appender, args=(path, mode, seconds, out)) for _ in range(processes)]
        for worker in workers:
            worker.start()
        latencies = sorted(x for _ in workers for x in out.get(timeout=seconds + 120))
        for worker in workers:
            worker.join(timeout=30)

    def pct(q: float) -> float:
        return latencies[round(q * (len(latencies) - 1))] * 1000

    return {"mode": mode, "appends": len(latencies), "p50": pct(0.5), "p99": pct(0.99), "max": latencies[-1] * 1000}


def table(rows: list[dict]) -> str:
    lines = ["| waiting for the write lock with | appends | p50 (ms) | p99 (ms) | max (ms) |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {MODES[r['mode']]} | {r['appends']} | {r['p50']:.2f} | {r['p99']:.2f} | {r['max']:.1f} |"
              for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    rows = []
    for _ in range(args.rounds):
        for mode in ("sqlite", "retry"):
            rows.append(measure(mode, args.processes, args.seconds))
            print(rows[-1], flush=True)
    print(table(rows))
    if not args.no_record:
        record_run(SECTION, ".venv/bin/python tests/perf/bench_write_lock.py " + shlex.join(sys.argv[1:]),
                   f"{args.processes} processes appending to one embedded log for {args.seconds:.0f} s per row, "
                   "the two ways alternating", table(rows), heading=" (contended appends)")


if __name__ == "__main__":
    main()
