"""Event log throughput, both adapters in one run: batched append, and group consumption.

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/bench_eventlog.py --events 50000

Prints a table (events/s) with the Kafka/embedded ratio and appends it, with the exact
command, to the "Event log" section of tests/perf/RESULTS.md (`--no-record` to skip).
Each run uses fresh topics and groups, so it can be repeated against the same broker.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipelines.eventlog import EventLog, Message, TopicSpec, open_event_log  # noqa: E402

RESULTS = ROOT / "tests" / "perf" / "RESULTS.md"
SECTION = "## Event log"
COLUMNS = ("append", "consume + commit", "consume + commit_with")


def append_rate(log: EventLog, topic: str, events: int, batch: int, value: bytes) -> float:
    started = time.perf_counter()
    for first in range(0, events, batch):
        log.append(topic, [Message(f"tenant-{i % 1000}", value) for i in range(first, min(first + batch, events))])
    return events / (time.perf_counter() - started)


def consume_rate(log: EventLog, topic: str, events: int, batch: int, *, outputs: str | None,
                 timeout_s: float) -> float:
    """One group member reads every event, committing after each poll; with `outputs`, each
    poll's unit of work also writes one output per input (`commit_with`, transactional).
    The clock starts at the first record, so the group join is not counted."""
    consumer = log.consumer(f"bench-{uuid.uuid4().hex[:8]}", [topic])
    seen, started = 0, None
    deadline = time.monotonic() + timeout_s
    try:
        while seen < events:
            if time.monotonic() > deadline:
                raise SystemExit(f"consumed only {seen} of {events} events in {timeout_s:.0f}s")
            records = consumer.poll(max_records=batch, timeout_s=1.0)
            if records and started is None:
                started = time.perf_counter()
            seen += len(records)
            consumer.commit_with([(outputs, Message(r.key, r.value)) for r in records] if outputs else [])
        return events / (time.perf_counter() - started)
    finally:
        consumer.close()


def bench(name: str, log: EventLog, args) -> dict[str, float]:
    value = os.urandom(args.value_bytes)
    topic, out = f"bench-{uuid.uuid4().hex[:8]}", f"bench-out-{uuid.uuid4().hex[:8]}"
    log.ensure_topics([TopicSpec(topic, args.partitions), TopicSpec(out, args.partitions)])
    rates = {"append": append_rate(log, topic, args.events, args.batch, value)}
    print(f"  {name}: append done", flush=True)
    rates["consume + commit"] = consume_rate(log, topic, args.events, args.batch, outputs=None,
                                             timeout_s=args.timeout)
    print(f"  {name}: consume + commit done", flush=True)
    rates["consume + commit_with"] = consume_rate(log, topic, args.events, args.batch, outputs=out,
                                                  timeout_s=args.timeout)
    print(f"  {name}: consume + commit_with done", flush=True)
    return rates


def table(results: dict[str, dict[str, float]]) -> str:
    lines = ["| adapter | " + " | ".join(f"{c} (events/s)" for c in COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]
    for name, rates in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{rates[c]:,.0f}" for c in COLUMNS) + " |")
    if {"kafka", "embedded"} <= results.keys():
        lines.append("| kafka / embedded | " + " | ".join(
            f"{results['kafka'][c] / results['embedded'][c]:.2f}x" for c in COLUMNS) + " |")
    return "\n".join(lines)


def record(command: str, args, text: str) -> None:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    entry = (f"### {stamp}\n\n`{command}`\n\n{args.events:,} events of {args.value_bytes} bytes, "
             f"batches of {args.batch}, {args.partitions} partitions, one consumer; "
             f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f} at the end: a shared machine), "
             f"Python {platform.python_version()}.\n\n{text}\n")
    content = RESULTS.read_text() if RESULTS.exists() else "# Benchmarks\n"
    if SECTION not in content:
        content = content.rstrip("\n") + f"\n\n{SECTION}\n\n"
    # Our entries go at the end of our section, before whatever section follows it.
    head, _, tail = content.partition(SECTION)
    nxt = tail.find("\n## ")
    body, rest = (tail, "") if nxt < 0 else (tail[:nxt + 1], tail[nxt + 1:])
    RESULTS.write_text(head + SECTION + body.rstrip("\n") + "\n\n" + entry + ("\n" + rest if rest else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=500, help="messages per append and max records per poll")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--adapters", default="embedded,kafka")
    parser.add_argument("--kafka", default=os.environ.get("LEDGERLM_TEST_KAFKA"),
                        help="kafka://host:port (default: $LEDGERLM_TEST_KAFKA)")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on each consume phase, seconds")
    parser.add_argument("--no-record", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-eventlog-") as tmp:
        for name in args.adapters.split(","):
            if name == "embedded":
                url = f"sqlite:///{tmp}/eventlog.db"
            elif name == "kafka":
                if not args.kafka:
                    raise SystemExit("no broker: pass --kafka kafka://host:port or set LEDGERLM_TEST_KAFKA")
                url = args.kafka
            else:
                raise SystemExit(f"unknown adapter {name!r}; expected embedded or kafka")
            print(f"{name}: {url}", flush=True)
            log = open_event_log(url)
            try:
                results[name] = bench(name, log, args)
            finally:
                log.close()

    text = table(results)
    print("\n" + text)
    if not args.no_record:
        env = f"LEDGERLM_TEST_KAFKA={args.kafka} " if "kafka" in results and "--kafka" not in sys.argv else ""
        python = os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT)) else "python"
        command = env + " ".join([python] + [shlex.quote(a) for a in sys.argv])
        record(command, args, text)
        print(f"\nrecorded in {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
