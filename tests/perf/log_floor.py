"""The least time the event log itself adds before a first token: the log hops of one
streamed generation with no platform code around them, on the Kafka log and the
embedded log, side by side.

Two processes, as deployed: a "front" (where the API would be) and a "taker" (a pool
worker with admission in it). For each request, in order:
  1. the front appends a prompt, then a request that names it (two appends, as the API);
  2. the taker's group member polls the request and commits a reservation with the
     request's position in one unit (`commit_with`, as admission taking work);
  3. once the unit's commit is answered, the taker appends a start and a token record to
     the stream in one append (as the stream writer);
  4. the front's tail on the stream sees the token record.
No HTTP, no admission decision, no engine: the chain is only what the design puts on the
log between a client's request and its first token, so its time is a floor under the
platform's added time to first token on that log. A record ends a poll at once, so the
poll waits (`--poll-wait-s`, `--tail-wait-s`) only bound idle loops. `--busy-cpu N` keeps a spinning process on
CPU N, as a CPU engine's compute thread does while it waits.

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/log_floor.py [--logs kafka embedded] [--requests 300] [--busy-cpu 1]

Prints a table (p50/p90 per hop); records nothing.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from models import topics  # noqa: E402
from pipelines.bootstrap import topic_specs  # noqa: E402
from pipelines.eventlog import EventLog  # noqa: E402
from pipelines.eventlog.base import Message  # noqa: E402
from tests.harness import open_isolated_log  # noqa: E402
from tests.perf.bench_noisy_neighbour import bench_topics_cleared  # noqa: E402
from tests.perf.bench_overhead import percentile  # noqa: E402

HOPS = ["prompt appended", "request appended", "taker has the request", "unit committed",
        "tokens appended and seen by the front"]
STOP = "stop"


def open_log(kind: str, home: str, namespace: str) -> EventLog:
    kafka_url = os.environ["LEDGERLM_TEST_KAFKA"] if kind == "kafka" else ""
    return open_isolated_log(kind, Path(home), kafka_url=kafka_url, namespace=namespace)


def taker(kind: str, home: str, namespace: str, ready, poll_wait_s: float) -> None:
    """Takes each request in a unit of its own, then writes its start and first tokens."""
    log = open_log(kind, home, namespace)
    member = log.consumer("floor-takers", [topics.REQUESTS.name], member_id="taker-1")
    ready.set()
    try:
        while True:
            for record in member.poll(max_records=10, timeout_s=poll_wait_s):
                if record.key == STOP:
                    member.commit()
                    return
                seen, committed = time.time(), []
                # The platform lets a generation write once the commit is answered, before its
                # markers are visible (`on_committed`); so does this.
                member.commit_with([(topics.LEDGER.name, Message(record.key, b"reserved " + record.value))],
                                   on_committed=lambda: committed.append(time.time()))
                stamps = f"{seen:.6f} {committed[0]:.6f}".encode()
                log.append(topics.STREAM.name, [Message(record.key, b"started"), Message(record.key, b"T " + stamps)])
    finally:
        member.close()
        log.close()


def spin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    while True:
        pass


def measure(kind: str, home: str, requests: int, poll_wait_s: float, tail_wait_s: float) -> dict[str, list[float]]:
    namespace = "bench" + uuid.uuid4().hex[:12]
    log = open_log(kind, home, namespace)
    log.ensure_topics(topic_specs())
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=taker, args=(kind, home, namespace, ready, poll_wait_s), daemon=True)
    child.start()
    if not ready.wait(60):
        child.kill()
        raise RuntimeError("the taker never started")
    stream_parts = log.partitions(topics.STREAM.name)
    tail = log.tail(topics.STREAM.name, {p: log.end_offset(topics.STREAM.name, p) for p in range(stream_parts)})
    hops: dict[str, list[float]] = {h: [] for h in HOPS}
    try:
        for i in range(requests + 10):  # the first ten warm up (and wait out the group join)
            key = f"r{i}-{uuid.uuid4().hex[:6]}"
            t0 = time.time()
            log.append(topics.PROMPTS.name, [Message(key, b"prompt text")])
            t1 = time.time()
            log.append(topics.REQUESTS.name, [Message(key, b"request")])
            t2 = time.time()
            deadline, got = time.monotonic() + 60, None
            while got is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no tokens for {key} within 60 s")
                for record in tail.poll(timeout_s=tail_wait_s):
                    if record.key == key and record.value.startswith(b"T "):
                        got = time.time(), [float(x) for x in record.value[2:].split()]
            t_seen, (t_taken, t_committed) = got
            if i >= 10:
                for hop, (a, b) in zip(HOPS, [(t0, t1), (t1, t2), (t2, t_taken), (t_taken, t_committed),
                                              (t_committed, t_seen)]):
                    hops[hop].append((b - a) * 1000)
        log.append(topics.REQUESTS.name, [Message(STOP, b"")])
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
        tail.close()
        log.close()
    return hops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--logs", nargs="+", choices=["kafka", "embedded"], default=["kafka", "embedded"])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--busy-cpu", type=int, default=None, help="a CPU to keep busy, as an engine's spinning compute thread")
    parser.add_argument("--poll-wait-s", type=float, default=0.2, help="the taker's poll wait (the worker's idle wait)")
    parser.add_argument("--tail-wait-s", type=float, default=0.5, help="the front's tail poll wait")
    args = parser.parse_args()
    spinner = None
    if args.busy_cpu is not None:
        spinner = mp.get_context("spawn").Process(target=spin, args=(args.busy_cpu,), daemon=True)
        spinner.start()
    columns = {}
    try:
        with tempfile.TemporaryDirectory() as home, bench_topics_cleared(*args.logs):
            for kind in args.logs:
                columns[kind] = measure(kind, home, args.requests, args.poll_wait_s, args.tail_wait_s)
    finally:
        if spinner is not None:
            spinner.kill()
    load = os.getloadavg()[0]
    busy = f", CPU {args.busy_cpu} kept busy" if args.busy_cpu is not None else ""
    print(f"{args.requests} sequential requests per log; {os.cpu_count()} CPUs, load average {load:.1f}{busy}")
    print("| hop | " + " | ".join(f"{k} p50 / p90 (ms)" for k in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for hop in HOPS + ["total"]:
        cells = []
        for hops in columns.values():
            values = [sum(v) for v in zip(*hops.values())] if hop == "total" else hops[hop]
            cells.append(f"{percentile(values, 0.5):.1f} / {percentile(values, 0.9):.1f}")
        print(f"| {hop} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
