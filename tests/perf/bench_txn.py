"""Back-to-back `commit_with` units on Kafka, as a busy admission processor or pool worker
makes them: each unit writes two records to two topics and commits its input position.

Two settings of the transactional producer's retry backoff, interleaved unit by unit in
one run: kafka-python's default (100 ms) and the platform's (`TXN_RETRY_BACKOFF_MS`). A
unit begun while the coordinator still completes the one before meets
CONCURRENT_TRANSACTIONS, and the client waits that backoff before trying again.

    .venv/bin/python tests/perf/bench_txn.py [--units 300] [--no-record]
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipelines.eventlog import Message, open_event_log  # noqa: E402
from pipelines.eventlog import kafka_groups  # noqa: E402
from pipelines.eventlog.base import TopicSpec  # noqa: E402
from pipelines.eventlog.namespaced import NamespacedEventLog  # noqa: E402
from tests.perf.bench_noisy_neighbour import bench_topics_cleared  # noqa: E402
from tests.perf.bench_overhead import percentile  # noqa: E402
from tests.perf.results import record_run  # noqa: E402

SECTION = "## Kafka transactions"


def member(log, backoff_ms: int, inputs: str):
    """A group member whose transactional producer retries after `backoff_ms`."""
    kafka_groups.TXN_RETRY_BACKOFF_MS = backoff_ms
    consumer = log.consumer(f"bench-txn-{backoff_ms}", [inputs], member_id=f"m{backoff_ms}")
    deadline = time.monotonic() + 60
    while not consumer.poll(timeout_s=0.2):
        if time.monotonic() > deadline:
            raise RuntimeError("no input reached the member")
    consumer.commit_with([])  # the producer is made (with this backoff) and its id fenced in
    return consumer


def run(units: int) -> dict[int, list[float]]:
    url = os.environ["LEDGERLM_TEST_KAFKA"]
    log = NamespacedEventLog(open_event_log(url), f"bench{uuid.uuid4().hex[:8]}")
    try:
        inputs, out_a, out_b = "in", "out-a", "out-b"
        log.ensure_topics([TopicSpec(inputs, 1, 3_600_000), TopicSpec(out_a, 2, 3_600_000),
                           TopicSpec(out_b, 2, 3_600_000)])
        log.append(inputs, [Message("k", b"x")])
        members = {backoff: member(log, backoff, inputs) for backoff in (100, kafka_groups.TXN_RETRY_BACKOFF_MS)}
        times: dict[int, list[float]] = {b: [] for b in members}
        for i in range(units):
            for backoff, consumer in members.items():
                log.append(inputs, [Message("k", b"%d" % i)])  # a new input position to commit
                consumer.poll(timeout_s=1.0)
                started = time.perf_counter()
                consumer.commit_with([(out_a, Message("k", b"a" * 200)), (out_b, Message("k", b"b" * 200))])
                times[backoff].append((time.perf_counter() - started) * 1000)
        for consumer in members.values():
            consumer.close()
        return times
    finally:
        log.close()


def table(times: dict[int, list[float]]) -> str:
    lines = ["| retry backoff | units | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) | units over 50 ms |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for backoff, xs in times.items():
        lines.append(f"| {backoff} ms | {len(xs)} | {percentile(xs, 0.5):.1f} | {percentile(xs, 0.9):.1f} | "
                     f"{percentile(xs, 0.99):.1f} | {max(xs):.1f} | {sum(x > 50 for x in xs)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--units", type=int, default=300)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    default_backoff = kafka_groups.TXN_RETRY_BACKOFF_MS
    with bench_topics_cleared("kafka"):
        times = run(args.units)
    kafka_groups.TXN_RETRY_BACKOFF_MS = default_backoff
    print(table(times))
    if not args.no_record:
        record_run(SECTION, ".venv/bin/python tests/perf/bench_txn.py " + shlex.join(sys.argv[1:]),
                   f"{args.units} units per setting, interleaved, each two 200-byte records to two topics and "
                   "one input position; single-node Kafka on loopback", table(times))


if __name__ == "__main__":
    main()
