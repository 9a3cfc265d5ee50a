"""Lost workers: which generations end when a worker goes silent (and which do not), that
each ends as `worker_lost` and settles exactly once, freeing its tenant's slot, and that
the judgement waits for a complete view of the fleet and is made a few times a second."""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from models import topics
from models.events import new_event
from models.events_fleet import Capacity
from models.events_generation import GenerationStarted
from models.fleet import WorkerState
from models.reservations import ReservationBook
from pipelines.admission.processor import end_lost, handle_requested, handle_terminal
from pipelines.fleet import READ_GAP_S, FleetView
from pipelines.admission.lost_workers import FleetWatch, gone_why, lost_generations, observe
from tests.unit.test_admission import GRACE, REV, T0, completed, registry, requested, types

LOST_AFTER_S = 3.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def worker(worker_id: str, *, last_seen: float = 0.0, left_at: float | None = None) -> WorkerState:
    return WorkerState(worker_id=worker_id, pool="interactive", model_revision=REV, engine_config_hash="abc",
                       host="h", pid=1, capacity=Capacity(max_seqs=1, kv_cache_tokens=0, max_model_len=512),
                       heartbeat_interval_ms=1000, joined_at=at(0), last_seen=at(last_seen),
                       left_at=None if left_at is None else at(left_at))


def started(request_id: str, worker_id: str):
    return new_event(GenerationStarted(request_id=request_id, worker_id=worker_id, model_revision=REV, queued_ms=0),
                     tenant_id="acme", correlation_id=request_id)


def book_running(**on_worker: str) -> ReservationBook:
    """Admitted requests (request id -> the worker running it)."""
    book = ReservationBook()
    for rid, worker_id in on_worker.items():
        handle_requested(requested(rid), registry=registry(), book=book, now=T0, grace=GRACE)
        book.started(rid, worker_id)
    return book


def test_a_worker_is_gone_when_silent_past_the_bound_or_long_left_never_when_unknown():
    assert gone_why(worker("w", last_seen=10), at(13), LOST_AFTER_S) is None  # 3 s: not yet
    assert "stopped heartbeating" in gone_why(worker("w", last_seen=10), at(13.1), LOST_AFTER_S)
    assert gone_why(worker("w", last_seen=10, left_at=11), at(12), LOST_AFTER_S) is None  # its ends may follow
    assert "left" in gone_why(worker("w", last_seen=10, left_at=11), at(14), LOST_AFTER_S)
    assert gone_why(None, at(1000), LOST_AFTER_S) is None
    slow = replace(worker("w", last_seen=10), heartbeat_interval_ms=5000)  # three of its beats: 15 s
    assert gone_why(slow, at(24), LOST_AFTER_S) is None
    assert gone_why(slow, at(25.1), LOST_AFTER_S) is not None


def test_only_the_silent_workers_generations_are_found():
    book = book_running(a1="w-dead", a2="w-dead", b1="w-live")
    fleet = [worker("w-dead", last_seen=1), worker("w-live", last_seen=9), worker("w-idle", last_seen=0)]
    found = lost_generations(book, fleet, at=at(10), lost_after_s=LOST_AFTER_S)
    assert sorted(r.request_id for r, _ in found) == ["a1", "a2"]
    assert lost_generations(book, fleet, at=at(3.5), lost_after_s=LOST_AFTER_S) == []


def test_a_lost_generation_fails_as_worker_lost_and_settles_once_at_zero():
    reg = registry()
    book = book_running(r1="w-dead")
    lost = lost_generations(book, [worker("w-dead")], at=at(10), lost_after_s=LOST_AFTER_S)
    out = end_lost(lost, book=book, now=at(10))
    assert types(out) == [(topics.OUTCOMES.name, "GenerationFailed"), (topics.STREAM.name, "GenerationFailed"),
                          (topics.LEDGER.name, "UsageSettled"), (topics.LEDGER.name, "ReservationReleased")]
    failed, settled, released = out[0][1], out[2][1].payload, out[3][1].payload
    assert failed.payload.error_code == "worker_lost" and failed.correlation_id == "r1" and failed.tenant_id == "acme"
    assert out[1][1] is failed, "the client streaming it reads the same end"
    assert (settled.terminal_status, settled.input_tokens, settled.output_tokens, settled.cost_micros) == \
        ("failed", 0, 0, 0)
    assert released.released_tokens == 30
    assert not book.open and not book.running
    # Found again, or the worker's own end arriving late: nothing settles twice.
    assert end_lost(lost, book=book, now=at(11)) == []
    assert lost_generations(book, [worker("w-dead")], at=at(20), lost_after_s=LOST_AFTER_S) == []
    assert handle_terminal(completed("r1"), registry=reg, book=book) == []
    assert handle_terminal(failed, registry=reg, book=book) == [], "its own notice settles nothing"


def test_the_tenants_slot_is_free_again_once_its_generation_is_lost():
    reg = registry(max_concurrent=1)
    book = book_running(only="w-dead")
    refused = handle_requested(requested("next"), registry=reg, book=book, now=at(5), grace=GRACE)
    assert refused[0][1].event_type == "GenerationRejected"
    end_lost(lost_generations(book, [worker("w-dead")], at=at(10), lost_after_s=LOST_AFTER_S), book=book, now=at(10))
    out = handle_requested(requested("again", at=at(10)), registry=reg, book=book, now=at(10), grace=GRACE)
    assert out[0][1].event_type == "BudgetReserved", out


def test_the_book_follows_starts_and_ends_of_open_requests_only():
    book = book_running(r1="w1")
    observe(book, started("r1", "w2"))  # taken again by another worker: the latest start counts
    assert book.running == {"w2": {"r1"}} and book.open["r1"].worker_id == "w2"
    observe(book, completed("r1"))  # its end is written, not settled yet: no worker runs it
    assert book.running == {} and "r1" in book.open
    observe(book, started("unknown", "w1"))  # a start of a request this book does not hold
    assert book.running == {}
    handle_requested(requested("r2"), registry=registry(), book=book, now=T0, grace=GRACE)
    observe(book, started("r2", "w1"))
    handle_terminal(completed("r2"), registry=registry(), book=book)
    assert book.running == {}, "a settled request leaves the index"
    assert book.open["r1"].reserved_at == T0


class StubView:
    def __init__(self, workers, complete_at, reading_since=None):
        self.workers, self.complete_at, self.reading_since = workers, complete_at, reading_since

    def all(self):
        return self.workers

    def close(self):
        pass


def test_the_watch_judges_as_of_its_last_complete_reads_and_a_few_times_a_second():
    book = book_running(r1="w-dead")
    view = StubView([worker("w-dead", last_seen=0)], complete_at=None)
    watch = FleetWatch(None, lost_after_s=LOST_AFTER_S, every_s=0.25, view=view, start=False)
    assert watch.lost(book, monotonic=100.0, read_to=at(10)) == [], "a view that never read to its end judges nobody"
    # The view stalled 2 s after the last beat (the clock went on): not lost, whatever the time now.
    view.complete_at = at(2)
    assert watch.lost(book, monotonic=100.3, read_to=at(10)) == []
    view.complete_at = at(10)
    assert watch.lost(book, monotonic=100.4, read_to=at(10)) == [], "checked at most every 0.25 s"
    # Admission's own input read only up to 2 s: an end the worker wrote may still come.
    assert watch.lost(book, monotonic=100.6, read_to=at(2)) == []
    assert watch.lost(book, monotonic=100.9, read_to=None) == []
    assert [r.request_id for r, _ in watch.lost(book, monotonic=101.2, read_to=at(10))] == ["r1"]


def test_a_worker_back_from_the_dead_does_not_revive_what_was_ended():
    book = book_running(r1="w")
    end_lost(lost_generations(book, [worker("w")], at=at(10), lost_after_s=LOST_AFTER_S), book=book, now=at(10))
    observe(book, started("r1", "w"))  # a late start (or beat) of the same worker changes nothing
    assert book.running == {} and not book.open
    back = replace(worker("w"), last_seen=at(11))
    assert lost_generations(book, [back], at=at(30), lost_after_s=LOST_AFTER_S) == []


class EvictingLog:
    """Just `evict`: remembers what it was asked; members listed in `members` are found."""

    def __init__(self, members: set[tuple[str, str]], fail: int = 0):
        self.members, self.fail, self.asked = members, fail, []

    def evict(self, group: str, member_id: str) -> bool:
        self.asked.append((group, member_id))
        if self.fail:
            self.fail -= 1
            raise ConnectionError("broker away")
        return (group, member_id) in self.members


def test_a_worker_gone_silent_is_evicted_from_its_groups_once_and_one_that_left_never():
    dead, left, live = worker("w-dead", last_seen=0), worker("w-left", last_seen=0, left_at=1), worker("w-live")
    work_group = topics.work_group("interactive", REV)
    log = EvictingLog({(work_group, "w-dead"), (topics.ADMISSION_GROUP, "w-dead-admission")}, fail=1)
    view = StubView([dead, left, replace(live, last_seen=at(9))], complete_at=at(2))
    watch = FleetWatch(log, lost_after_s=LOST_AFTER_S, view=view, start=False)
    assert watch.evict_gone() == [] and log.asked == [], "silent for 2 s is not gone yet"
    view.complete_at = at(10)
    try:  # the log fails the first try: nothing is taken as done
        watch.evict_gone()
        raise AssertionError("the log's failure should reach the caller")
    except ConnectionError:
        pass
    assert watch.evict_gone() == ["w-dead"]
    assert log.asked[1:] == [(work_group, "w-dead"), (topics.ADMISSION_GROUP, "w-dead-admission")]
    assert watch.evict_gone() == [] and len(log.asked) == 3, "evicted once"


def test_a_log_that_cannot_evict_leaves_it_to_the_session_timeouts():
    class Plain:
        def evict(self, group, member_id):
            raise NotImplementedError
    watch = FleetWatch(Plain(), lost_after_s=LOST_AFTER_S, view=StubView([worker("w", last_seen=0)], at(10)),
                       start=False)
    assert watch.evict_gone() == [] and watch.evict_gone() == []



def test_silence_counts_only_from_when_the_reader_could_hear_again():
    """A broker outage silences every worker for its length: that silence is not theirs."""
    silent = worker("w", last_seen=0)
    assert gone_why(silent, at(10), LOST_AFTER_S, heard_since=at(8)) is None
    assert "stopped heartbeating" in gone_why(silent, at(11.1), LOST_AFTER_S, heard_since=at(8))
    book = book_running(r1="w")
    assert lost_generations(book, [silent], at=at(10), lost_after_s=LOST_AFTER_S, heard_since=at(8)) == []
    watch = FleetWatch(None, lost_after_s=LOST_AFTER_S, view=StubView([silent], at(10), reading_since=at(8)),
                       start=False)
    assert watch.lost(book, monotonic=1.0, read_to=at(10)) == []


class EmptyTail:
    """A fleet topic with nothing on it, whose reads fail while `down`."""

    def __init__(self):
        self.offsets, self.down = {0: 0}, False

    def seek_to_time(self, ms):
        pass

    def end_offsets(self):
        if self.down:
            raise ConnectionError("broker away")
        return {0: 0}

    def close(self):
        pass


class OneTailLog:
    def __init__(self, tail):
        self._tail = tail

    def partitions(self, name):
        return 1

    def tail(self, name, offsets):
        return self._tail


def test_the_view_reads_unbroken_from_its_first_read_and_again_from_the_one_after_a_gap():
    tail, now = EmptyTail(), [at(0)]
    view = FleetView(OneTailLog(tail), lost_after_s=LOST_AFTER_S, clock=lambda: now[0])
    view.refresh()
    assert view.reading_since == at(0)
    now[0] = at(0.5)
    view.refresh()
    assert (view.complete_at, view.reading_since) == (at(0.5), at(0)), "reads close together: one run"
    tail.down = True
    for t in (1, 5, 9):  # the log is away: no read completes
        now[0] = at(t)
        try:
            view.refresh()
            raise AssertionError("the failed read should reach the caller")
        except ConnectionError:
            pass
    assert view.reading_since == at(0)
    tail.down = False
    now[0] = at(0.5 + READ_GAP_S + 10)
    view.refresh()
    assert view.reading_since == view.complete_at == at(0.5 + READ_GAP_S + 10)
