"""`FleetView`: what a process (API, admission) knows of the worker fleet, read from the
fleet topic.

It starts reading at `now - lost_after_s - one heartbeat interval` (`lost_after_s` is by
default three of each worker's own intervals): every worker alive then has a heartbeat,
which repeats its identity and capacity, in that suffix, so no older record is needed.
`refresh()` reads what was appended before it was called, bounded in records and time,
never waiting for more. Queries answer from the state as of the last refresh, judged
against the clock now (so a silent worker goes lost without a refresh). `complete_at` is
the time as of which the view holds every event (the start of the last refresh that read
to the ends): a judge that must not mistake its own lag for a worker's silence (admission
ending a lost worker's generations) judges as of then. `look_back_s` reads further back
at the start, so a view opened late still knows workers that went silent before it.

An event counts at its record's timestamp (the writer's clock, capped at the reader's
now): hosts' clocks must agree well within `lost_after_s`, as NTP gives.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Callable

from models import topics
from models.events import EventDecodeError, decode
from models.fleet import LOST_AFTER_INTERVALS, FleetState, PoolCapacity, WorkerState
from pipelines.eventlog import EventLog
from pipelines.eventlog.base import Tail

logger = logging.getLogger(__name__)

# The heartbeat interval the read-back window assumes (workers beat about once a second);
# a view of slower workers is told theirs.
DEFAULT_INTERVAL_S = 1.0
# Complete reads further apart than this mean the view could not read the log meanwhile (an
# outage, a stalled host): silence in that gap is not the workers' own (`reading_since`).
READ_GAP_S = 2.0


def wall_clock() -> datetime:
    return datetime.now(timezone.utc)


class FleetView:
    def __init__(self, log: EventLog, *, lost_after_s: float | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], datetime] = wall_clock,
                 forget_after_s: float = 600.0, max_records: int = 5000, max_read_s: float = 0.5,
                 look_back_s: float = 0.0):
        self._log = log
        self.lost_after_s = lost_after_s  # None: three of each worker's own heartbeat intervals
        self._interval_s = interval_s
        self._clock = clock
        # How far back a worker alive now last beat: the read-back window, less one interval.
        self._silence_s = lost_after_s if lost_after_s is not None else LOST_AFTER_INTERVALS * interval_s
        self._forget_after = timedelta(seconds=max(forget_after_s, self._silence_s, look_back_s))
        # A reader that shows workers lost or gone within `look_back_s` starts that far back.
        self._look_back_s = max(self._silence_s + interval_s, look_back_s)
        self.complete_at: datetime | None = None
        # When the current run of complete reads began, none more than `READ_GAP_S` after the
        # one before: heartbeats the log could not carry to the view before then are not
        # missed ones (after a broker outage every worker would look silent for its length).
        self.reading_since: datetime | None = None
        self._max_records, self._max_read_s = max_records, max_read_s
        self._state = FleetState()
        self._tail: Tail | None = None
        self._reading = threading.Lock()  # one refresh at a time owns the tail
        self._lock = threading.Lock()  # guards the state: queries never wait on the log

    def refresh(self) -> "FleetView":
        """Folds the fleet events appended before the call (up to `max_records`, within
        about `max_read_s`); never waits for new ones."""
        with self._reading:
            began = self._clock()
            tail = self._open()
            ends = tail.end_offsets()
            deadline = time.monotonic() + self._max_read_s
            read = 0
            while read < self._max_records and any(tail.offsets[p] < end for p, end in ends.items()):
                records = tail.poll(max_records=self._max_records - read, timeout_s=0.05)
                read += len(records)
                with self._lock:
                    now = self._clock()
                    for record in records:
                        self._fold(record.value, min(_at(record.timestamp_ms), now))
                if time.monotonic() >= deadline:
                    logger.warning("fleet view: read only to %s of %s within %.1fs", tail.offsets, ends,
                                   self._max_read_s)
                    break
            with self._lock:
                self._state.forget(self._clock() - self._forget_after)
                if all(tail.offsets[p] >= end for p, end in ends.items()):
                    if self.complete_at is None or (began - self.complete_at).total_seconds() > READ_GAP_S:
                        self.reading_since = began
                    self.complete_at = began
        return self

    def _open(self) -> Tail:
        if self._tail is None:
            name = topics.FLEET.name
            tail = self._log.tail(name, {p: 0 for p in range(self._log.partitions(name))})
            since = self._clock() - timedelta(seconds=self._look_back_s)
            try:
                tail.seek_to_time(int(since.timestamp() * 1000))
            except BaseException:
                tail.close()  # the next refresh opens another: one per failed try would pile up
                raise
            self._tail = tail
        return self._tail

    def _fold(self, value: bytes, at: datetime) -> None:
        try:
            env = decode(value)
        except EventDecodeError as exc:
            logger.warning("fleet view: skipping an unreadable record: %s", exc)
            return
        self._state.apply(env.payload, at)

    def close(self) -> None:
        with self._reading:
            if self._tail is not None:
                self._tail.close()
                self._tail = None

    # -- queries, as of the last refresh ------------------------------------------------

    def _ask(self, query: Callable[[FleetState, datetime], object]):
        with self._lock:
            return query(self._state, self._clock())

    def live(self) -> list[WorkerState]:
        return self._ask(lambda s, now: s.live(now, self.lost_after_s))

    def lost(self) -> list[WorkerState]:
        return self._ask(lambda s, now: s.lost(now, self.lost_after_s))

    def all(self) -> list[WorkerState]:
        return self._ask(lambda s, now: s.all())

    def worker(self, worker_id: str) -> WorkerState | None:
        return self._ask(lambda s, now: s.worker(worker_id))

    def serving(self, *, pool: str | None = None, revision: str | None = None) -> list[WorkerState]:
        return self._ask(lambda s, now: s.serving(now, self.lost_after_s, pool=pool, revision=revision))

    def serves(self, pool: str, revision: str) -> bool:
        return self._ask(lambda s, now: s.serves(pool, revision, now, self.lost_after_s))

    def serves_soon(self, pool: str, revision: str, *, within_s: float = 1.0) -> bool:
        """Whether a live worker of `pool` serves `revision`, reading the topic again for up to
        `within_s` when none does yet (a worker that just joined may still be on its way)."""
        if self.serves(pool, revision):  # as of the last refresh (the API refreshes in the background)
            return True
        deadline = time.monotonic() + within_s
        while True:
            self.refresh()
            if self.serves(pool, revision):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def capacity(self) -> dict[tuple[str, str], PoolCapacity]:
        return self._ask(lambda s, now: s.capacity(now, self.lost_after_s))

    def revisions(self, *, pool: str | None = None) -> set[str]:
        return self._ask(lambda s, now: s.revisions(now, self.lost_after_s, pool=pool))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _at(timestamp_ms: int) -> datetime:
    return datetime.fromtimestamp(timestamp_ms / 1000, timezone.utc)
