"""How often a record appended while a Kafka consumer waits reaches it late, with
kafka-python's consumer defaults and with the settings `KafkaEventLog.consumer_config`
uses instead.

One consumer (`read_committed`, assigned every partition of a fresh topic, broker-side
fetch wait 500 ms, as a group member's default) per setting. Each round: a short poll
(a fetch goes out and waits at the broker), a 20 ms pause, one record appended to the
next partition, then polls until it arrives. A record counts as late past 50 ms; the
broker answers within a few.

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/kafka_delivery.py [--rounds 150] [--partitions 8]

Prints a table; records nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kafka import KafkaConsumer, TopicPartition  # noqa: E402

from pipelines.eventlog import open_event_log  # noqa: E402
from pipelines.eventlog.base import Message, TopicSpec  # noqa: E402
from tests.helpers import wait_until  # noqa: E402
from tests.perf.bench_noisy_neighbour import bench_topics_cleared  # noqa: E402
from tests.perf.bench_overhead import percentile  # noqa: E402

CLIENT_DEFAULTS = {"enable_incremental_fetch_sessions": True, "retry_backoff_ms": 100}
SETTINGS = {
    "kafka-python's defaults": {},
    "no fetch sessions": {"enable_incremental_fetch_sessions": False},
    "10 ms retry backoff": {"retry_backoff_ms": 10},
    "both (as consumer_config)": {"enable_incremental_fetch_sessions": False, "retry_backoff_ms": 10},
}
LATE_MS = 50.0


def delivery_ms(log, topic: str, poll: Callable[[float], Iterable], *, partitions: int, rounds: int) -> list[float]:
    """Per round: a short poll (a fetch goes out and waits at the broker), a 20 ms pause, one
    record appended to the next partition of `topic`, then polls until it arrives; ms from
    append to arrival. `poll(wait_s)` returns the records a consumer got."""
    times = []
    for i in range(rounds):
        poll(0.01)
        time.sleep(0.02)
        value = b"round %d" % i
        sent = time.monotonic()
        log.append(topic, [Message("k", value, partition=i % partitions)])
        wait_until(lambda: any(r.value == value for r in poll(0.5)), 10, every_s=0,
                   what=f"round {i}'s record to arrive")
        times.append((time.monotonic() - sent) * 1000)
    return times


def with_settings(log, settings: dict, partitions: int, rounds: int) -> list[float]:
    """`delivery_ms` for a consumer of a fresh topic with `settings` over the client's defaults."""
    topic = "bench-delivery-" + uuid.uuid4().hex[:10]
    log.ensure_topics([TopicSpec(topic, partitions)])
    log.append(topic, [Message("k", b"warm", partition=p) for p in range(partitions)])
    config = {**log.consumer_config(client_id="bench-delivery", fetch_max_wait_ms=500), **CLIENT_DEFAULTS, **settings}
    consumer = KafkaConsumer(**config)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)

    def poll(wait_s: float) -> list:
        return [r for batch in consumer.poll(timeout_ms=int(wait_s * 1000)).values() for r in batch]

    try:
        got = 0
        while got < partitions:
            got += len(poll(0.5))
        return delivery_ms(log, topic, poll, partitions=partitions, rounds=rounds)
    finally:
        consumer.close(autocommit=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()
    rows = []
    with bench_topics_cleared("kafka"):
        log = open_event_log(os.environ["LEDGERLM_TEST_KAFKA"])
        try:
            for name, settings in SETTINGS.items():
                times = with_settings(log, settings, args.partitions, args.rounds)
                late = [t for t in times if t > LATE_MS]
                rows.append((name, len(late), len(times), percentile(times, 0.5), percentile(times, 0.99), max(times)))
        finally:
            log.close()
    print(f"{args.rounds} rounds per setting, {args.partitions} partitions, fetch wait 500 ms; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"| consumer settings | late (> {LATE_MS:.0f} ms) | p50 (ms) | p99 (ms) | max (ms) |")
    print("|---|---:|---:|---:|---:|")
    for name, late, total, p50, p99, worst in rows:
        print(f"| {name} | {late} of {total} | {p50:.1f} | {p99:.1f} | {worst:.1f} |")


if __name__ == "__main__":
    main()
