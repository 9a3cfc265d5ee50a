"""Admission's service rates survive a restart: they are read back from the outcomes topic.

What admission measures (`pipelines.admission.capacity.ServiceRates`, and the quota's queue time)
is a smoothed fold of the starts and ends on the outcomes partitions it owns. Whenever it
rebuilds its book (at start, after a rebalance, after a failed unit), it folds the latest
of those records again, each partition up to the group's committed position: what comes
after is polled and folded as it comes, so nothing is folded twice. The same records in
the same order give the same figures as the processor that measured them; across
partitions they are folded in the order they were written, which the live poll only
approximates (a smoothed figure moves little for it).

Why the log rather than rates carried by the workers' heartbeats: admission's estimate
is of its own partitions, measured from events it already consumes, so folding them
again rebuilds exactly what it had, with no new field on the fleet topic for every kind
of worker to fill, and it holds after the workers restarted too (their heartbeats would
start from nothing). Reading back is bounded: `READ_BACK_RECORDS` per partition, enough
that what came before weighs nothing at the rates' smoothing (0.8 to the power of the
generations folded since).
"""
from __future__ import annotations

import heapq
from typing import Callable

from models import topics
from models.events import Envelope, EventDecodeError, decode
from pipelines.admission.capacity import CapacityBook, Key
from pipelines.eventlog import EventLog, GroupConsumer, Record

READ_BACK_RECORDS = 1000  # per partition: a start and an end per generation


def latest_outcomes(log: EventLog, ends: dict[int, int], *, records: int = READ_BACK_RECORDS) -> list[Record]:
    """The last `records` outcomes before each partition's `ends` offset, merged in the order
    they were written (each partition's own order kept)."""
    starts = {p: max(0, end - records) for p, end in ends.items() if end > 0}
    if not starts:
        return []
    tail = log.tail(topics.OUTCOMES.name, starts)
    try:
        lows = tail.low_offsets()  # where retention dropped older records
    finally:
        tail.close()
    runs = []
    for partition, start in sorted(starts.items()):
        offset, end, run = max(start, lows.get(partition, 0)), ends[partition], []
        while offset < end:
            batch = log.read(topics.OUTCOMES.name, partition, offset, max_records=min(2000, end - offset))
            if not batch:
                break  # below the end nothing readable is left (aborted records, markers)
            run += [r for r in batch if r.offset < end]
            offset = batch[-1].offset + 1
        runs.append(run)
    return list(heapq.merge(*runs, key=lambda r: r.timestamp_ms))


def read_back_rates(log: EventLog, consumer: GroupConsumer, partitions: set[int], capacity: CapacityBook, *,
                    key: Callable[[Envelope], Key], records: int = READ_BACK_RECORDS) -> int:
    """Forgets `capacity`'s rates and folds the latest outcomes of `partitions` (the ledger's,
    same keys and count) up to `consumer`'s committed positions; `key`: the (pool, revision)
    of an outcome. Returns how many records it folded."""
    capacity.forget_rates()
    committed = consumer.committed_offsets([(topics.OUTCOMES.name, p) for p in sorted(partitions)])
    ends = {p: at for (_, p), at in committed.items() if at}  # never committed: all is polled again
    folded = 0
    for record in latest_outcomes(log, ends, records=records):
        try:
            env = decode(record.value)
        except EventDecodeError:
            continue
        capacity.observe(env, key(env))
        folded += 1
    return folded
