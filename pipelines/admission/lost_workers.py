"""Lost workers in seconds: admission ends the generations of a worker that went silent.

A worker that dies without leaving (SIGKILL, its host gone) stops heartbeating on the fleet
topic. Admission, the single writer of its tenants' reservations, holds a `FleetWatch` (a
`FleetView` refreshed on a thread of its own, so the hot path only asks memory) and knows
which worker runs which open request from the `GenerationStarted` events on the outcomes
topic it consumes (`ReservationBook.started`). Once a worker is judged gone, each of its
generations in admission's partitions gets a terminal `GenerationFailed(worker_lost)` on
the outcomes and stream topics (a client streaming it sees its end) and is settled at
zero, as an expiry is: what the worker made never reached the ledger. The book closes the
reservation, so the worker's own late terminal, should it come back, settles nothing.

Which worker runs a request is not written to the ledger: the outcomes topic already holds
it durably, and a ledger event per start would put one more write on every generation.
After a rebalance `note_running` reads it back from the outcomes partitions admission owns,
from the oldest open reservation's time on (bounded by deadline plus grace).

Gone means: silent (no heartbeat for `lost_after_s`, or three of the worker's own heartbeat
intervals where those are longer) without a leave, or left at least
`lost_after_s` ago with generations still open (its terminals would have come first). A
worker the view never heard of is not judged (a worker without fleet presence, or one
that died before the view's read-back): the expiry sweep still ends its work. Silence is
judged as of the view's last complete read (`FleetView.complete_at`), so a log that
answers slowly makes nobody lost, and counted only from when the view began to read
unbroken (`FleetView.reading_since`), so a broker outage, which silences every worker for
its length, makes nobody lost either; and no later than admission last read all its input, so
an end the worker wrote before it went is read and settled at its real usage, never
overtaken by a `worker_lost` of its own request.
"""
from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta

from models import topics
from models.events import EventDecodeError, decode
from models.events_generation import (
    GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationStarted,
)
from models.fleet import LOST_AFTER_INTERVALS, WorkerState
from models.reservations import Reservation, ReservationBook
from pipelines.eventlog import EventLog
from pipelines.fleet import FleetView

logger = logging.getLogger(__name__)
TERMINALS = (GenerationCompleted, GenerationFailed, GenerationCancelled)
# Clocks of hosts and the read-back of starts: a start is stamped after its reservation was
# made, up to clock skew between the API's host and the worker's.
START_SKEW = timedelta(seconds=60)


def gone_why(worker: WorkerState | None, at: datetime, lost_after_s: float,
             heard_since: datetime | None = None) -> str | None:
    """Why `worker`'s running generations are to be ended as of `at`, or None. Silence is
    counted from `heard_since` at the earliest (`FleetView.reading_since`: before then the
    reader could not have heard it)."""
    if worker is None:
        return None  # never heard of: not judged (the expiry sweep ends its work)
    # Never less than three of the worker's own intervals: one that beats slowly is not lost between beats.
    own = timedelta(milliseconds=LOST_AFTER_INTERVALS * worker.heartbeat_interval_ms)
    after = max(timedelta(seconds=lost_after_s), own)
    if worker.left_at is not None:
        if at - worker.left_at >= after:
            return f"worker {worker.worker_id} left with this generation still running"
        return None
    silent_from = worker.last_seen if heard_since is None else max(worker.last_seen, heard_since)
    if at - silent_from > after:
        return f"worker {worker.worker_id} stopped heartbeating (last heard {worker.last_seen.isoformat()})"
    return None


def lost_generations(book: ReservationBook, workers: list[WorkerState], *, at: datetime,
                     lost_after_s: float, heard_since: datetime | None = None) -> list[tuple[Reservation, str]]:
    """Open generations of the gone workers among `workers` (judged as of `at`), with why."""
    found = []
    for worker in workers:
        if worker.worker_id in book.running and (why := gone_why(worker, at, lost_after_s, heard_since)) is not None:
            found += [(reservation, why) for reservation in book.running_on(worker.worker_id)]
    return found


def observe(book: ReservationBook, env) -> None:
    """Follows one outcome: a start names the worker running it, an end takes it off."""
    p = env.payload
    if isinstance(p, GenerationStarted):
        book.started(p.request_id, p.worker_id)
    elif isinstance(p, TERMINALS):
        book.ending(p.request_id)


def note_running(log: EventLog, book: ReservationBook, partitions: set[int]) -> int:
    """Reads which worker runs each open request of `book` back from the outcomes topic's
    `partitions` (the ledger's, same keys and count), from the oldest open reservation on;
    returns how many records it read."""
    times = [r.reserved_at for r in book.open.values() if r.reserved_at is not None]
    if not times or not partitions:
        return 0
    since = min(times) - START_SKEW
    tail = log.tail(topics.OUTCOMES.name, {p: 0 for p in partitions})
    try:
        tail.seek_to_time(int(since.timestamp() * 1000))
        start = dict(tail.offsets)
    finally:
        tail.close()
    read = 0
    for record in log.read_topic(topics.OUTCOMES.name, start, page=5000):
        read += 1
        try:
            env = decode(record.value)
        except EventDecodeError:
            continue
        if env.correlation_id in book.open:
            observe(book, env)
    return read


def groups_of(worker: WorkerState) -> list[tuple[str, str]]:
    """The consumer groups a worker may be a member of, with its member id in each: its
    pool's work group, and admission's (a worker that admits)."""
    return [(topics.work_group(worker.pool, worker.model_revision), worker.worker_id),
            (topics.ADMISSION_GROUP, topics.admission_member(worker.worker_id))]


class FleetWatch:
    """Admission's view of the fleet, refreshed every `every_s` on a daemon thread; `lost`
    finds what gone workers ran, at most every `every_s` too (never per record).

    A worker judged gone without leaving is also evicted from its consumer groups
    (`EventLog.evict`), once: its queued work (the partitions of its pool's work topics it
    held) moves to the survivors at once, and so do the tenants whose admission it ran, where
    it admitted; left to the groups' session timeouts (`group_session_timeout_s`), both
    waited that much longer."""

    def __init__(self, log: EventLog, *, lost_after_s: float, every_s: float = 0.25, read_back_s: float = 120.0,
                 view: FleetView | None = None, start: bool = True, evict: bool = True):
        self.lost_after_s = lost_after_s
        self.view = view or FleetView(log, lost_after_s=lost_after_s, look_back_s=read_back_s)
        self._log = log if evict else None
        self.evicted: set[str] = set()  # workers evicted from their groups (or found in none)
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_check = 0.0
        if start:
            self._thread = threading.Thread(target=self._follow, name="admission-fleet", daemon=True)
            self._thread.start()

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                self.view.refresh()
                self.evict_gone()
            except Exception:  # a log that fails now may answer next time; nobody is judged meanwhile
                if self._stop.is_set():
                    return
                logger.exception("admission could not read the fleet topic; trying again")
            self._stop.wait(self._every_s)

    def evict_gone(self) -> list[str]:
        """Evicts each worker gone silent (as of the view's last complete read) from its
        groups, once; returns the workers evicted now. One that could not be is tried again."""
        at = self.view.complete_at
        if self._log is None or at is None:
            return []
        done = []
        for worker in self.view.all():
            if worker.left_at is not None or worker.worker_id in self.evicted:
                continue  # one that left closed its memberships itself
            why = gone_why(worker, at, self.lost_after_s, self.view.reading_since)
            if why is None:
                continue
            try:
                evicted = [group for group, member in groups_of(worker) if self._log.evict(group, member)]
            except NotImplementedError:
                self._log = None  # this log cannot: the session timeouts decide
                return done
            self.evicted.add(worker.worker_id)
            done.append(worker.worker_id)
            if evicted:
                logger.warning("%s; evicted from %s, so its partitions move now", why, ", ".join(evicted))
        return done

    def lost(self, book: ReservationBook, *, monotonic: float, read_to: datetime | None
             ) -> list[tuple[Reservation, str]]:
        """Open generations of gone workers, with why, judged as of the earlier of the view's
        last complete read and `read_to` (when the caller last read all of its input, the
        outcomes included: an end the worker wrote before it went is settled first, at its
        real usage). None between checks, or before both."""
        if monotonic < self._next_check or not book.running:
            return []
        self._next_check = monotonic + self._every_s
        if self.view.complete_at is None or read_to is None:
            return []
        at = min(self.view.complete_at, read_to)
        return lost_generations(book, self.view.all(), at=at, lost_after_s=self.lost_after_s,
                                heard_since=self.view.reading_since)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.view.close()
