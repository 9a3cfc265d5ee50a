"""Workers announce themselves on the fleet topic and a view in another process's place
(its own log handle) sees them: joined with revision and capacity, their load, their
leaving, their going silent, and all of it from a reader that starts late. Both logs."""
from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import pytest

from models.events_fleet import Capacity
from pipelines.fleet import FleetView, wall_clock
from tests.conftest import make_log_opener
from tests.helpers import wait_until as wait_for
from workers.fleet_presence import FleetPresence, Load, WorkerIdentity

INTERVAL_S = 0.25
LOST_AFTER_S = 1.5
CAP = Capacity(max_seqs=8, kv_cache_tokens=16384, max_model_len=1024)


@pytest.fixture(scope="module", params=["embedded", "kafka"])
def opener(request, tmp_path_factory):
    return make_log_opener(request.param, tmp_path_factory.mktemp(f"fleet-{request.param}"))


@dataclass
class Worker:
    presence: FleetPresence
    load: Load
    log: object

    @property
    def id(self) -> str:
        return self.presence.identity.worker_id

    def set_load(self, **changes) -> None:
        self.load = replace(self.load, **changes)

    def kill(self) -> None:
        """What SIGKILL leaves behind: the beats stop and no leave is ever sent."""
        self.presence._stop.set()  # noqa: SLF001
        self.presence._thread.join(5)  # noqa: SLF001
        assert not self.presence._thread.is_alive()  # noqa: SLF001


@pytest.fixture
def workers(opener):
    started: list[Worker] = []

    def start(revision: str = "rev-a", pool: str = "interactive") -> Worker:
        log = opener()
        identity = WorkerIdentity(worker_id=f"w-{uuid.uuid4().hex[:8]}", pool=pool, model_revision=revision,
                                  engine_config_hash=f"hash-{revision}", capacity=CAP)
        worker = Worker(None, Load(running=0, waiting=0, free_slots=8, kv_cache_usage=0.0, output_tokens_per_s=0.0),
                        log)
        worker.presence = FleetPresence(log, identity, lambda: worker.load, interval_s=INTERVAL_S)
        worker.presence.start()
        started.append(worker)
        return worker
    yield start
    for worker in started:
        worker.presence._stop.set()  # noqa: SLF001 - a killed one must not say it left now
        worker.presence._thread.join(5)  # noqa: SLF001
        worker.log.close()


@pytest.fixture
def view(opener):
    views: list[tuple[FleetView, object]] = []

    def make(lost_after_s: float = LOST_AFTER_S) -> FleetView:
        log = opener()
        v = FleetView(log, lost_after_s=lost_after_s, interval_s=INTERVAL_S)
        views.append((v, log))
        return v
    yield make
    for v, log in views:
        v.close()
        log.close()


def seen(view: FleetView, worker_id: str, status: str = "live"):
    """The worker as the view has it after a refresh, if its status is `status`."""
    view.refresh()
    worker = view.worker(worker_id)
    found = {w.worker_id for w in (view.lost() if status == "lost" else view.live())}
    return worker if worker_id in found else None


def test_a_joined_worker_is_live_with_its_revision_capacity_and_load(workers, view):
    fleet = view()
    worker = workers(revision="rev-a")
    w = wait_for(lambda: seen(fleet, worker.id), timeout_s=10, what="the worker to appear")
    assert (w.pool, w.model_revision, w.engine_config_hash, w.capacity) == ("interactive", "rev-a", "hash-rev-a", CAP)
    assert fleet.serves("interactive", "rev-a") and not fleet.serves("interactive", "rev-b")
    assert "rev-a" in fleet.revisions(pool="interactive")

    worker.set_load(running=5, waiting=2, free_slots=3, kv_cache_usage=0.6, output_tokens_per_s=42.5)
    w = wait_for(lambda: (x := seen(fleet, worker.id)) and x.free_slots == 3 and x, timeout_s=10,
                 what="the new load to show")
    assert (w.running, w.waiting, w.kv_cache_usage, w.output_tokens_per_s) == (5, 2, 0.6, 42.5)
    mine = [x for x in fleet.serving(pool="interactive", revision="rev-a") if x.worker_id == worker.id]
    assert len(mine) == 1


def test_capacity_is_summed_over_the_workers_of_a_pool_and_revision(workers, view):
    fleet = view()
    pool = f"p-{uuid.uuid4().hex[:6]}"
    a1, a2, b1 = workers("rev-a", pool), workers("rev-a", pool), workers("rev-b", pool)
    a2.set_load(free_slots=2, running=6)
    wait_for(lambda: fleet.refresh().capacity().get((pool, "rev-a")) is not None
             and fleet.capacity()[pool, "rev-a"].workers == 2 and fleet.capacity()[pool, "rev-a"].free_slots == 10
             and (pool, "rev-b") in fleet.capacity(), timeout_s=10, what="both revisions' capacity")
    a = fleet.capacity()[pool, "rev-a"]
    assert (a.max_seqs, a.kv_cache_tokens, a.running) == (16, 32768, 6)
    assert fleet.capacity()[pool, "rev-b"].workers == 1
    assert fleet.revisions(pool=pool) == {"rev-a", "rev-b"}
    assert {a1.id, b1.id} <= {w.worker_id for w in fleet.live()}


def test_close_makes_the_worker_leave_at_once(workers, view):
    fleet = view()
    worker = workers()
    wait_for(lambda: seen(fleet, worker.id), timeout_s=10, what="the worker to appear")
    worker.presence.close("shutdown", exit_code=0)
    fleet.refresh()  # one read: the leave was appended before close returned
    w = fleet.worker(worker.id)
    assert w.left_at is not None and (w.left_reason, w.exit_code) == ("shutdown", 0)
    assert worker.id not in {x.worker_id for x in fleet.live() + fleet.lost()}


def test_a_draining_worker_takes_no_work(workers, view):
    fleet = view()
    pool = f"p-{uuid.uuid4().hex[:6]}"
    worker = workers("rev-a", pool)
    wait_for(lambda: fleet.refresh().serves(pool, "rev-a"), timeout_s=10, what="the worker to serve")
    worker.presence.draining("engine_dead")
    fleet.refresh()
    assert not fleet.serves(pool, "rev-a")
    assert worker.id in {w.worker_id for w in fleet.live()}


class RecordingClock:
    """The view's clock, remembering the last time it gave: the moment a query was judged."""

    def __init__(self):
        self.last: datetime | None = None

    def __call__(self) -> datetime:
        self.last = wall_clock()
        return self.last


def test_a_worker_that_stops_beating_without_leaving_is_lost_within_lost_after(workers, view, opener):
    """The view calls a silent worker lost by its own clock: at the first query more than
    `lost_after` past the worker's last beat, never before. Judged on the view's clock at
    each query, so how late a busy machine runs the test's polls does not count against it."""
    clock = RecordingClock()
    log = opener()
    fleet = FleetView(log, lost_after_s=LOST_AFTER_S, interval_s=INTERVAL_S, clock=clock)
    try:
        worker = workers()
        wait_for(lambda: seen(fleet, worker.id), timeout_s=10, what="the worker to appear")
        worker.kill()
        killed_at = wall_clock()
        judged: list[tuple[datetime, bool]] = []  # (the view's time of the query, lost?)

        def lost():
            fleet.refresh()
            is_lost = worker.id in {w.worker_id for w in fleet.lost()}
            judged.append((clock.last, is_lost))
            return is_lost
        wait_for(lost, timeout_s=10, what="the worker to be reported lost")
        w = fleet.worker(worker.id)
        assert w.left_at is None and w.last_seen is not None
        assert worker.id not in {x.worker_id for x in fleet.serving()}
        bound = w.last_seen + timedelta(seconds=LOST_AFTER_S)
        # Never early: every query judged before the bound kept it live; lost at the first after it.
        assert all(not is_lost for at, is_lost in judged if at <= bound), (bound, judged)
        assert all(is_lost for at, is_lost in judged if at > bound), (bound, judged)
        # Its beats stopped with the kill: the last one came within an interval of it (plus slack
        # for a heartbeat thread a busy machine ran late), so lost_after after the kill at most.
        assert (killed_at - w.last_seen).total_seconds() <= INTERVAL_S + 1.0, (killed_at, w.last_seen)
    finally:
        fleet.close()
        log.close()


def test_a_view_started_after_the_join_sees_the_worker_from_its_heartbeats(workers, view):
    first = view()
    worker = workers(revision="rev-late")
    w = wait_for(lambda: seen(first, worker.id), timeout_s=10, what="the worker to appear")
    joined_at = w.joined_at
    # Until the join is older than the late view's read-back window (lost_after + interval).
    window_s = LOST_AFTER_S + INTERVAL_S
    wait_for(lambda: (x := seen(first, worker.id)) and (x.last_seen - joined_at).total_seconds() > window_s
             + INTERVAL_S, timeout_s=15, what="the join to age past the late view's window")
    late = view()
    late.refresh()
    w = late.worker(worker.id)
    assert w is not None, "a heartbeat within the window should have made the worker known"
    assert w.joined_at is None  # known from a heartbeat alone
    assert (w.model_revision, w.engine_config_hash, w.capacity) == ("rev-late", "hash-rev-late", CAP)
    assert late.serves("interactive", "rev-late")


def test_queries_may_come_from_other_threads_while_refreshing(workers, view):
    fleet = view()
    worker = workers()
    errors: list[BaseException] = []
    stop = threading.Event()

    def ask() -> None:
        try:
            while not stop.is_set():
                fleet.capacity(), fleet.live(), fleet.serves("interactive", "rev-a")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=ask, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: seen(fleet, worker.id), timeout_s=10, what="the worker to appear")
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    assert not errors
