"""Capacity-aware admission: each decision with injected capacity and measured rates, the
queue admission counts, and the hook in `handle_requested` (refused before it queues); the
floors from the settings, and the measured rates read back from the log after a restart."""
from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from api.errors import rejection_error
from models import topics
from models.events import new_event
from models.events_generation import GenerationCompleted, GenerationRejected, GenerationStarted, Timings
from models.events_fleet import Capacity
from models.fleet import PoolCapacity, WorkerState
from models.reservations import ReservationBook
from models.settings import Settings
from pipelines.admission.processor import handle_requested
from pipelines.bootstrap import Bootstrap, topic_specs
from pipelines.admission.capacity import CapacityBook, Floors, Outlook, QueueBound, ServiceRates, check, estimate, key_of
from pipelines.eventlog import open_event_log
from pipelines.publish import publish
from pipelines.admission.service_readback import read_back_rates
from tests.unit.test_admission import GRACE, REV, T0, registry, requested, types

KEY = key_of(None, REV)
BOUND = QueueBound(per_slot=2, floor=0)  # 8 slots: normal up to 16 queued, high up to 32


def live(workers=2, slots=8, running=0, waiting=0, tokens_per_s=0.0) -> PoolCapacity:
    return PoolCapacity(workers=workers, max_seqs=slots, free_slots=slots - running, running=running,
                        waiting=waiting, output_tokens_per_s=tokens_per_s)


def measured(ttft_ms=100.0, tpot_ms=10.0, service_ms=1000.0) -> ServiceRates:
    return ServiceRates(ttft_ms=ttft_ms, tpot_ms=tpot_ms, service_ms=service_ms)


def decide(outlook: Outlook, *, priority="normal", max_output_tokens=91, left_ms=60_000):
    return check(outlook, priority=priority, max_output_tokens=max_output_tokens, deadline_left_ms=left_ms,
                 bound=BOUND)


def test_no_live_worker_for_the_revision_is_refused_with_a_retry():
    refused = decide(Outlook(KEY, PoolCapacity()))
    assert refused.reason == "no_capacity" and refused.retry_after_ms > 0
    assert REV in refused.message


def test_a_fleet_not_read_yet_refuses_nothing():
    assert decide(Outlook(KEY, None, queued=1000), left_ms=1) is None


def test_the_queue_ahead_drained_by_the_live_slots_sets_the_start():
    # 8 slots all busy, 16 queued ahead, 1 s a request: two rounds before it starts.
    est = estimate(Outlook(KEY, live(running=8), queued=16, rates=measured()), priority="normal",
                   max_output_tokens=91)
    assert (est.ahead, est.wait_ms, est.serve_ms) == (16, 2000, 100 + 900)
    # Idle slots take the first of the queue at once.
    idle = estimate(Outlook(KEY, live(running=0), queued=8, rates=measured()), priority="normal",
                    max_output_tokens=91)
    assert idle.wait_ms == 0


def test_a_deadline_the_queue_ahead_makes_impossible_is_refused_with_when_to_come_back():
    outlook = Outlook(KEY, live(running=8), queued=15, rates=measured())  # starts in ~1.9 s, ends ~1 s later
    refused = decide(outlook, left_ms=2500)
    assert refused.reason == "deadline" and "15 requests queued ahead" in refused.message
    assert refused.retry_after_ms == 1875  # the request alone fits: the queue is in the way
    assert decide(outlook, left_ms=3500) is None


def test_a_deadline_the_request_alone_cannot_meet_is_refused_for_good():
    refused = decide(Outlook(KEY, live(), rates=measured()), max_output_tokens=200, left_ms=500)
    assert refused.reason == "deadline" and refused.retry_after_ms is None


def test_before_anything_is_measured_the_floors_refuse_only_hopeless_deadlines():
    assert decide(Outlook(KEY, live()), max_output_tokens=200, left_ms=200) is None
    assert decide(Outlook(KEY, live()), max_output_tokens=200, left_ms=20).reason == "deadline"


def test_a_worker_just_starting_its_first_requests_does_not_make_deadlines_look_hopeless():
    # Four sequences running, a few tokens reported over the last beat: no pace to go by yet.
    starting = Outlook(KEY, live(running=4, tokens_per_s=0.5))
    assert estimate(starting, priority="normal", max_output_tokens=101).serve_ms == 5 + 50
    assert decide(starting, max_output_tokens=100, left_ms=60_000) is None


def test_normal_priority_is_shed_at_the_bound_high_queues_twice_as_far():
    at_bound = Outlook(KEY, live(running=8), queued=16, queued_high=0, rates=measured())
    shed = decide(at_bound)
    assert shed.reason == "shed" and shed.retry_after_ms >= 1000 and "up to 16" in shed.message
    assert decide(at_bound, priority="high") is None
    full = Outlook(KEY, live(running=8), queued=32, queued_high=10, rates=measured())
    assert decide(full, priority="high").reason == "shed"
    assert decide(Outlook(KEY, live(running=8), queued=15, rates=measured())) is None


def test_the_bound_follows_the_live_slots_so_losing_a_worker_sheds_sooner():
    queued = Outlook(KEY, live(workers=3, slots=12, running=12), queued=20, rates=measured())
    assert decide(queued) is None  # 2 a slot: 24
    fewer = Outlook(KEY, live(workers=2, slots=8, running=8), queued=20, rates=measured())
    assert decide(fewer).reason == "shed"
    assert decide(fewer, priority="high") is None
    assert QueueBound(per_slot=4, floor=16).limit("normal", 1) == 16


def test_the_fleets_waiting_counts_when_it_is_more_than_admission_queued():
    assert decide(Outlook(KEY, live(running=8, waiting=16), queued=2, rates=measured())).reason == "shed"


def test_high_priority_waits_only_behind_high_work():
    outlook = Outlook(KEY, live(running=8), queued=15, queued_high=0, rates=measured())
    assert decide(outlook, left_ms=2500).reason == "deadline"
    assert decide(outlook, priority="high", left_ms=2500) is None


def completed(output_tokens: int, ttft_ms: int, duration_ms: int) -> GenerationCompleted:
    return GenerationCompleted(request_id="r", finish_reason="length", input_tokens=1, output_tokens=output_tokens,
                               model_revision=REV, output_sha256="x",
                               timings=Timings(queued_ms=0, ttft_ms=ttft_ms, duration_ms=duration_ms))


def test_rates_are_measured_from_completed_generations():
    rates = ServiceRates(smoothing=0.5)
    rates.observe_completed(completed(11, ttft_ms=200, duration_ms=1200))
    assert (rates.ttft_ms, rates.tpot_ms, rates.service_ms) == (200, 100, 1200)
    rates.observe_completed(completed(11, ttft_ms=400, duration_ms=1400))
    assert (rates.ttft_ms, rates.tpot_ms, rates.service_ms) == (300, 100, 1300)
    rates.observe_start(80)
    assert rates.queue_ms == 80


class FakeFleet:
    def __init__(self, capacity=None, complete_at=T0):
        self.seen = capacity or {}
        self.complete_at = complete_at
        self.refreshes = 0
        self.on_refresh = None

    def capacity(self):
        return dict(self.seen)

    def all(self):
        return []

    def refresh(self):
        self.refreshes += 1
        self.complete_at = self.complete_at + timedelta(seconds=1)
        if self.on_refresh:
            self.seen.update(self.on_refresh)
        return self


def test_the_book_counts_what_it_queued_until_it_starts_or_ends():
    book = CapacityBook(FakeFleet({KEY: live()}))
    for i in range(3):
        book.queued(f"r{i}", KEY, "high" if i == 0 else "normal")
    book.queued("r1", KEY, "normal")  # decided again after a failed commit: counted once
    outlook = book.outlook(KEY, asked_at=T0)
    assert (outlook.queued, outlook.queued_high) == (3, 1)
    book.started("r0", KEY, queued_ms=50)
    book.ended("r1", KEY, completed(11, ttft_ms=200, duration_ms=1200))
    assert (book.outlook(KEY, asked_at=T0).queued, book.rates_of(KEY).queue_ms) == (1, 50)
    assert book.rates_of(KEY).tpot_ms == 100
    book.prune(open_ids=set())  # expired or lost: no longer open
    assert book.outlook(KEY, asked_at=T0).queued == 0


def test_a_worker_joined_after_the_last_read_is_looked_for_before_refusing():
    fleet = FakeFleet({}, complete_at=T0)
    fleet.on_refresh = {KEY: live()}
    book = CapacityBook(fleet)
    assert book.outlook(KEY, asked_at=T0 + timedelta(milliseconds=100)).capacity == live()
    assert fleet.refreshes == 1
    # Read after the request was made: no worker then means none.
    empty = CapacityBook(FakeFleet({}, complete_at=T0), hold_s=0)
    assert empty.outlook(KEY, asked_at=T0 - timedelta(seconds=1)).capacity.workers == 0


def test_no_live_worker_is_taken_for_none_only_once_none_has_served_for_a_while():
    clock = [T0]
    fleet = FakeFleet({}, complete_at=T0 + timedelta(hours=1))
    gone = WorkerState(worker_id="w", pool=KEY[0], model_revision=REV, engine_config_hash="h", host="h", pid=1,
                       capacity=Capacity(max_seqs=2, kv_cache_tokens=0, max_model_len=512), heartbeat_interval_ms=1000,
                       joined_at=T0, last_seen=T0 + timedelta(seconds=5))
    fleet.all = lambda: [gone]
    book = CapacityBook(fleet, hold_s=10, clock=lambda: clock[0])
    clock[0] = T0 + timedelta(seconds=14)  # its worker went silent 9 s ago: one may be on its way
    assert book.outlook(KEY, asked_at=T0).capacity is None
    clock[0] = T0 + timedelta(seconds=16)
    assert book.outlook(KEY, asked_at=T0).capacity.workers == 0
    other = ("interactive", "never-served")  # none ever: counted from when admission started watching
    assert book.outlook(other, asked_at=T0).capacity.workers == 0
    assert CapacityBook(fleet, hold_s=10).outlook(other, asked_at=T0).capacity is None


def test_refused_for_capacity_before_it_queues():
    reg, book = registry(may_send_high=True), ReservationBook()
    fleet = FakeFleet({KEY: live(running=8)})
    capacity = CapacityBook(fleet, bound=BOUND, hold_s=0)
    for i in range(16):
        capacity.queued(f"q{i}", KEY, "normal")
    out = handle_requested(requested("r1"), registry=reg, book=book, now=T0, grace=GRACE, capacity=capacity)
    assert types(out) == [(topics.LEDGER.name, "GenerationRejected"), (topics.STREAM.name, "GenerationRejected")]
    assert out[0][1].payload.reason == "shed" and "r1" not in book.open and book.decided("r1")
    high = handle_requested(requested("r2", priority="high"), registry=reg, book=book, now=T0, grace=GRACE,
                            capacity=capacity)
    assert types(high)[-1] == (topics.work_topic(None, "high", REV).name, "GenerationQueued")
    fleet.seen = {}
    gone = handle_requested(requested("r3", at=T0 - timedelta(seconds=5)), registry=reg, book=book, now=T0,
                            grace=GRACE, capacity=capacity)
    assert gone[0][1].payload.reason == "no_capacity"


def test_shedding_is_a_503_with_retry_after_apart_from_limits():
    for reason in ("shed", "no_capacity"):
        error = rejection_error(GenerationRejected(request_id="r", reason=reason, message="m", retry_after_ms=2500))
        assert (error.status, error.code, error.headers) == (503, reason, {"Retry-After": "3"})
    limit = rejection_error(GenerationRejected(request_id="r", reason="rate", message="m", retry_after_ms=1000))
    assert limit.status == 429


def test_now_is_when_the_deadline_counts_from():
    book = CapacityBook(FakeFleet({KEY: live()}))
    req = requested("r1", deadline_s=1.0).payload
    assert book.check(req, pool=None, asked_at=T0, now=T0) is None
    late = book.check(req, pool=None, asked_at=T0, now=T0 + timedelta(seconds=1))
    assert late.reason == "deadline"


def test_key_names_the_shared_pool():
    assert key_of(None, REV) == (topics.SHARED_POOL, REV) == key_of(topics.SHARED_POOL, REV)


# -- the floors are settings; the measured rates are read back from the log --------------


def test_the_floors_come_from_the_settings_and_feed_both_deadline_checks(monkeypatch):
    monkeypatch.setenv("LEDGERLM_ADMISSION_FLOOR_FIRST_TOKEN_MS", "50")
    monkeypatch.setenv("LEDGERLM_ADMISSION_FLOOR_MS_PER_OUTPUT_TOKEN", "2")
    floors = Bootstrap(Settings()).service_floors()
    assert floors == Floors(first_token_ms=50, ms_per_output_token=2)
    book = CapacityBook(FakeFleet({KEY: live()}), floors=floors)
    assert book.estimate.min_service_ms(101) == 50 + 200  # the quota's check, before the fleet's
    req = requested("r1", max_output_tokens=101, deadline_s=0.2).payload
    assert book.check(req, pool=None, asked_at=T0, now=T0).reason == "deadline"
    assert CapacityBook(FakeFleet({KEY: live()})).check(req, pool=None, asked_at=T0, now=T0) is None


@pytest.mark.parametrize("name", ["ADMISSION_FLOOR_FIRST_TOKEN_MS", "ADMISSION_FLOOR_MS_PER_OUTPUT_TOKEN"])
def test_a_negative_floor_is_refused_at_start(monkeypatch, name):
    monkeypatch.setenv(f"LEDGERLM_{name}", "-1")
    with pytest.raises(ValidationError, match=name.lower()):
        Settings()
    with pytest.raises(ValueError, match="ms_per_output_token"):
        Floors(ms_per_output_token=-0.5)


class CommittedAt:
    """A group consumer as far as the read-back asks it: the committed outcomes positions."""

    def __init__(self, log, **less):
        self.ends = {p: log.end_offset(topics.OUTCOMES.name, p) - less.get("by", 0)
                     for p in range(log.partitions(topics.OUTCOMES.name))}

    def committed_offsets(self, partitions):
        return {(t, p): self.ends[p] or None for t, p in partitions}


def outcomes_of(tenant: str, revision: str, n: int, *, ttft_ms: int, duration_ms: int, queued_ms: int):
    out = []
    for i in range(n):
        rid = f"{revision}-{i}"
        out.append(new_event(GenerationStarted(request_id=rid, worker_id="w", model_revision=revision,
                                               queued_ms=queued_ms + 10 * i), tenant_id=tenant, correlation_id=rid))
        done = completed(11, ttft_ms=ttft_ms + i, duration_ms=duration_ms + 7 * i)
        out.append(new_event(done.model_copy(update={"request_id": rid, "model_revision": revision}),
                             tenant_id=tenant, correlation_id=rid))
    return out


def test_a_restarted_book_reads_back_the_rates_its_predecessor_measured(tmp_path):
    log = open_event_log(f"sqlite:///{tmp_path / 'log.db'}")
    log.ensure_topics(topic_specs())
    slow = key_of(None, "slow@1")
    events = outcomes_of("acme", REV, 30, ttft_ms=200, duration_ms=1200, queued_ms=50) \
        + outcomes_of("acme", "slow@1", 12, ttft_ms=900, duration_ms=4000, queued_ms=400)
    publish(log, topics.OUTCOMES, events)
    key = lambda env: key_of(None, env.payload.model_revision)  # noqa: E731
    measured_live = CapacityBook(FakeFleet({KEY: live(running=8), slow: live(running=8)}))
    for env in events:  # as admission follows them
        measured_live.observe(env, key(env))

    restarted = CapacityBook(FakeFleet({KEY: live(running=8), slow: live(running=8)}))
    partitions = set(range(log.partitions(topics.OUTCOMES.name)))
    assert read_back_rates(log, CommittedAt(log), partitions, restarted, key=key) == len(events)
    assert restarted.rates == measured_live.rates and restarted.rates[slow].tpot_ms > 200
    assert restarted.estimate.queue_ms == measured_live.estimate.queue_ms > 0
    # A decision that depends on the measured pace is the same; the floors alone would admit it.
    for book in (measured_live, restarted):
        book.queued("q", slow, "normal")
    req = requested("r1", max_output_tokens=11, deadline_s=3.0).payload.model_copy(update={"model_revision": "slow@1"})
    decided = [book.check(req, pool=None, asked_at=T0, now=T0) for book in (measured_live, restarted)]
    assert decided[0] == decided[1] and decided[0].reason == "deadline"
    assert CapacityBook(FakeFleet({slow: live(running=8)})).check(req, pool=None, asked_at=T0, now=T0) is None


def test_what_is_past_the_committed_position_is_left_to_be_polled(tmp_path):
    log = open_event_log(f"sqlite:///{tmp_path / 'log.db'}")
    log.ensure_topics(topic_specs())
    events = outcomes_of("acme", REV, 5, ttft_ms=200, duration_ms=1200, queued_ms=50)
    publish(log, topics.OUTCOMES, events)
    key = lambda env: KEY  # noqa: E731
    committed_before_the_last = CapacityBook(None)
    for env in events[:-2]:
        committed_before_the_last.observe(env, KEY)
    restarted = CapacityBook(None)
    restarted.observe(events[0], KEY)  # what it held before is forgotten, not added to
    partitions = set(range(log.partitions(topics.OUTCOMES.name)))
    assert read_back_rates(log, CommittedAt(log, by=2), partitions, restarted, key=key) == len(events) - 2
    assert restarted.rates == committed_before_the_last.rates
    # Never committed: nothing is read back, all of it is polled again.
    assert read_back_rates(log, CommittedAt(log, by=len(events)), partitions, restarted, key=key) == 0
    assert restarted.rates == {}
