"""KV claims (`pipelines.admission.kv_claims`): the claim arithmetic, claims held per pool and worker
and released once, admission queueing within the deadline or shedding `kv_capacity`
(normal before high), capacity lowered while engines preempt, placement by free KV, and the
setting that bounds it all."""
from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta

import pytest
from pydantic import ValidationError

from api.errors import rejection_error
from api.live import FALLBACK_CODES
from models import topics
from models.events import new_event
from models.events_fleet import Capacity
from models.events_generation import GenerationRejected, UsageSettled
from models.fleet import PoolCapacity, WorkerState
from models.reservations import Reservation, ReservationBook
from models.settings import Settings
from pipelines.admission.processor import handle_requested
from pipelines.admission.capacity import CapacityBook, Outlook, QueueBound, ServiceRates, check, key_of
from pipelines.eventlog import partition_for
from pipelines.admission.kv_claims import KvClaims, KvOutlook, PreemptionGuard, claim_of, kv_check, kv_wait
from pipelines.admission.placement import Placement, kv_by_worker, probe_order
from tests.unit.test_admission import GRACE, REV, T0, registry, requested

KEY = key_of(None, REV)
P = 32


def test_a_claim_is_the_prompt_and_every_output_token_capped_at_the_max_length():
    assert claim_of(300, 200, 512) == 500
    assert claim_of(400, 200, 512) == 512
    assert claim_of(10, 5, None) == 15 == claim_of(10, 5, 0)


def test_claims_are_held_per_pool_and_worker_and_released_once():
    claims, other = KvClaims(), ("interactive", "other@1")
    claims.hold("a", KEY, 300, worker_id="w1")
    claims.hold("b", KEY, 200, high=True)
    claims.hold("c", other, 100, worker_id="w2", running=True)
    claims.hold("a", KEY, 999)  # decided again after a failed commit: held once
    assert (claims.claims(KEY), claims.claims(other)) == (500, 100)
    assert claims.sums(KEY) == (500, 0, 200)
    claims.started("b", "w2")  # placed nowhere known, started on w2: held there now
    claims.started("a", "w1")
    assert claims.sums(KEY) == (500, 500, 0)
    assert (claims.on_worker("w1"), claims.on_worker("w2")) == (300, 300)
    assert claims.release("b") == 200 and claims.release("b") == 0, "a second end releases nothing"
    assert (claims.claims(KEY), claims.on_worker("w2")) == (300, 100)
    settled = new_event(UsageSettled(request_id="a", reservation_id="res", terminal_status="failed",
                                     input_tokens=0, output_tokens=0, cost_micros=0),
                        tenant_id="acme", correlation_id="a")
    claims.release_settled([(topics.LEDGER, settled)])
    claims.prune({"c"})
    assert claims.claims(KEY) == 0 and claims.keys() == [other]


def test_a_rebuild_claims_again_for_open_reservations_where_they_run():
    def reservation(request_id, tokens, revision=REV, worker=None):
        return Reservation("res-" + request_id, request_id, "acme", tokens, 0, T0, revision, worker_id=worker)
    claims = KvClaims()
    claims.hold("stale", KEY, 50)
    claims.rebuild([reservation("a", 300, worker="w1"), reservation("b", 700)],
                   key=lambda r: key_of(None, r.model_revision), max_model_len=lambda revision: 512)
    assert claims.sums(KEY) == (300 + 512, 300, 0)
    assert claims.on_worker("w1") == 300 and claims.of("stale") is None


def test_past_the_capacity_a_request_waits_for_claims_to_drain():
    kv = KvOutlook(capacity=1000, held=1000, running=800, high_waiting=0)
    wait = kv_wait(kv, 500, priority="normal", per_request_ms=2000)
    assert (wait.excess, wait.wait_ms) == (500, 1000)  # half the capacity drains in half a service
    assert kv_wait(kv, 100, priority="high", per_request_ms=2000).wait_ms == 0, "high: only running claims ahead"
    alone = kv_wait(KvOutlook(capacity=1000), 1500, priority="normal", per_request_ms=2000)
    assert alone.wait_ms == 0, "nothing ahead: it starts at once, alone"


def decide(kv: KvOutlook, claim: int, *, priority="normal", left_ms=None):
    return kv_check(kv, claim, key=KEY, priority=priority, per_request_ms=2000, serve_ms=1500,
                    deadline_left_ms=left_ms, queue_factor=1.0, high_factor=2.0)


def test_claims_queue_within_the_deadline_and_are_shed_past_it_with_a_retry():
    full = KvOutlook(capacity=1000, held=1000, running=1000)
    assert decide(KvOutlook(capacity=1000, held=400), 600, left_ms=1) is None, "fits now"
    assert decide(full, 500, left_ms=3000) is None, "starts in about 1 s, done within 3 s"
    refused = decide(full, 500, left_ms=2000)
    assert refused.reason == "kv_capacity" and refused.retry_after_ms == 1000
    assert "1000 KV tokens are claimed" in refused.message and "start in about 1000 ms" in refused.message
    assert decide(KvOutlook(), 10**6, left_ms=1) is None, "no KV reported: slots alone decide"


def test_normal_priority_is_shed_before_high():
    # Capacity 1000, one capacity more may wait (normal), two for high.
    kv = KvOutlook(capacity=1000, held=1800, running=1000)
    shed = decide(kv, 300)
    assert shed.reason == "kv_capacity" and "queues up to 2000" in shed.message
    assert shed.retry_after_ms >= 1000
    assert decide(kv, 300, priority="high") is None
    assert decide(KvOutlook(capacity=1000, held=2800, running=1000), 300, priority="high").reason == "kv_capacity"


def test_kv_capacity_is_a_503_with_retry_after_that_a_router_may_fall_back_from():
    error = rejection_error(GenerationRejected(request_id="r", reason="kv_capacity", message="m",
                                               retry_after_ms=2500))
    assert (error.status, error.code, error.headers) == (503, "kv_capacity", {"Retry-After": "3"})
    assert "kv_capacity" in FALLBACK_CODES, "a refusal for capacity: the overload ladder tries a smaller revision"


def worker(worker_id: str, kv_tokens: int, preemptions: int = 0, partitions=None) -> WorkerState:
    return WorkerState(worker_id=worker_id, pool=KEY[0], model_revision=REV, engine_config_hash="h", host="h", pid=1,
                       capacity=Capacity(max_seqs=8, kv_cache_tokens=kv_tokens, max_model_len=512),
                       heartbeat_interval_ms=1000, joined_at=T0, last_seen=T0, preemptions=preemptions,
                       work_partitions=partitions)


class Fleet:
    """What admission's capacity book reads of the fleet: workers of one revision."""

    def __init__(self, *workers: WorkerState):
        self.workers, self.complete_at = list(workers), T0

    def capacity(self):
        pool = PoolCapacity()
        for w in self.workers:
            pool = pool.plus(w)
        return {KEY: pool}

    def all(self):
        return list(self.workers)

    def refresh(self):
        return self


def test_the_book_admits_against_its_fleets_kv_times_the_overcommit():
    fleet = Fleet(worker("w1", 1000), worker("w2", 2000))
    book = CapacityBook(fleet, bound=QueueBound(per_slot=1.0, floor=0, kv_overcommit=1.5))
    assert book.kv_capacity(KEY) == 4500
    outlook = book.outlook(KEY, asked_at=T0)
    assert (outlook.kv.capacity, outlook.kv.held) == (4500, 0)
    book.kv_claims.hold("a", KEY, 4000)
    assert book.claims(KEY) == 4000 and book.outlook(KEY, asked_at=T0).kv.held == 4000


def test_preemptions_lower_the_capacity_until_they_stop():
    clock = [T0]
    guard = PreemptionGuard(lambda: clock[0], cut=0.8, floor=0.5, quiet_s=30)
    assert guard.observe(KEY, [worker("w1", 1000, preemptions=7)]) == 1.0, "a first look is a baseline"
    assert guard.observe(KEY, [worker("w1", 1000, preemptions=9)]) == pytest.approx(0.8)
    clock[0] += timedelta(seconds=10)
    assert guard.observe(KEY, [worker("w1", 1000, preemptions=12)]) == pytest.approx(0.64)
    for _ in range(5):
        guard.observe(KEY, [worker("w1", 1000, preemptions=99 + _)])
    assert guard.factor(KEY) == 0.5, "never below the floor"
    assert guard.observe(KEY, [worker("w1", 1000, preemptions=3)]) == 0.5, "a restarted worker is no rise"
    clock[0] += timedelta(seconds=30)
    assert guard.factor(KEY) == 0.5, "still within the quiet period"
    clock[0] += timedelta(seconds=15)
    assert guard.factor(KEY) == pytest.approx(0.75)
    clock[0] += timedelta(seconds=15)
    assert guard.factor(KEY) == 1.0


def test_a_preempting_revision_sheds_what_its_whole_capacity_would_queue():
    clock = [T0]
    fleet = Fleet(worker("w1", 1000))
    book = CapacityBook(fleet, bound=QueueBound(per_slot=1.0, floor=0), clock=lambda: clock[0])
    book.kv_claims.hold("held", KEY, 1700, running=True)
    req = requested("r1", input_tokens=100, max_output_tokens=100, deadline_s=600).payload
    assert book.check(req, pool=None, asked_at=T0, now=T0) is None  # 1900 of 2000; no preemptions so far
    fleet.workers = [worker("w1", 1000, preemptions=3)]
    refused = book.check(req, pool=None, asked_at=T0, now=T0)
    assert refused.reason == "kv_capacity" and book.kv_capacity(KEY) == 800
    clock[0] += timedelta(seconds=61)
    assert book.check(req, pool=None, asked_at=T0, now=T0) is None and book.kv_capacity(KEY) == 1000


def test_admission_refuses_kv_capacity_before_it_queues_and_claims_what_it_admits():
    reg, book = registry(may_send_high=True), ReservationBook()
    capacity = CapacityBook(Fleet(worker("w1", 1000)), bound=QueueBound(per_slot=0.5, floor=0), hold_s=0)
    capacity.kv_claims.hold("running", KEY, 1200, running=True)
    out = handle_requested(requested("r1", input_tokens=200, max_output_tokens=200), registry=reg, book=book,
                           now=T0, grace=GRACE, capacity=capacity)
    assert out[0][1].payload.reason == "kv_capacity" and "r1" not in book.open
    high = handle_requested(requested("r2", priority="high", input_tokens=200, max_output_tokens=200),
                            registry=reg, book=book, now=T0, grace=GRACE, capacity=capacity)
    assert high[-1][1].event_type == "GenerationQueued"
    # A claim is capped at the revision's max length (512): 500 + 300 claims 512.
    capped = handle_requested(requested("r3", input_tokens=500, max_output_tokens=300, deadline_s=600),
                              registry=reg, book=book, now=T0, grace=GRACE,
                              capacity=CapacityBook(Fleet(worker("w1", 512)), hold_s=0))
    assert capped[-1][1].event_type == "GenerationQueued"


def test_without_kv_figures_the_outlook_decides_by_slots_as_before():
    outlook = Outlook(KEY, PoolCapacity(workers=1, max_seqs=8), rates=ServiceRates())
    assert check(outlook, priority="normal", max_output_tokens=10, deadline_left_ms=10_000, claim=10**6) is None


# -- placement by free KV ---------------------------------------------------------------------


def test_a_worker_without_kv_room_is_passed_over_while_another_has_some():
    owners = {p: f"w{p % 2}" for p in range(P)}
    affinity = "tenant/system"
    home = owners[probe_order(affinity, P)[0]]
    away = "w1" if home == "w0" else "w0"
    placement = Placement()
    slots = {"w0": 8, "w1": 8}
    kv = {"w0": 1000, "w1": 1000}
    chosen = placement.choose("work", P, "r1", affinity, owners, slots, claim=300, kv=kv,
                              kv_load={home: 800, away: 0})
    assert owners[chosen] == away
    idle = placement.choose("work", P, "r2", affinity, owners, slots, claim=5000, kv=kv, kv_load={})
    assert owners[idle] == home, "bigger than any cache: it goes where its prefix is, to run alone"


def test_without_an_affinity_a_request_leaves_its_keys_worker_only_when_that_has_no_room():
    owners = {p: f"w{p % 2}" for p in range(P)}
    slots, kv = {"w0": 8, "w1": 8}, {"w0": 1000, "w1": 1000}
    home_p = partition_for("r1", P)
    placement = Placement()
    assert placement.choose("work", P, "r1", None, owners, slots, claim=300, kv=kv, kv_load={}) == home_p
    full = placement.choose("work", P, "r2", None, owners, slots, claim=300, kv=kv,
                            kv_load={owners[partition_for("r2", P)]: 900})
    assert owners[full] != owners[partition_for("r2", P)], "its key's worker holds 900 of 1000: it goes elsewhere"
    unknown = Placement().choose("work", P, "r3", None, None, None, claim=300)
    assert unknown == partition_for("r3", P), "no heartbeat names owners: where its key puts it"


@pytest.mark.parametrize("how", ["round-robin", "range"])
def test_a_burst_of_long_prompts_fills_workers_in_proportion_to_their_kv(how):
    """Nothing ends during the burst: the worker with twice the KV takes about twice the tokens."""
    owners = {p: f"w{p % 2}" for p in range(P)} if how == "round-robin" else {p: f"w{p * 2 // P}" for p in range(P)}
    kv = kv_by_worker([worker("w0", 1000), worker("w1", 2000), worker("none", 0)])
    assert kv == {"w0": 1000, "w1": 2000}
    rng = random.Random(7)
    placement, load = Placement(slack=2), Counter()
    for i in range(60):
        claim = rng.choice([250, 300, 350])
        chosen = placement.choose("work", P, f"r{i}", f"prefix-{i % 3}", owners, {"w0": 64, "w1": 64},
                                  claim=claim, kv=kv, kv_load=dict(load))
        load[owners[chosen]] += claim
    assert 1.7 <= load["w1"] / load["w0"] <= 2.3, load


# -- the setting ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_an_overcommit_of_zero_or_less_stops_the_process_at_start(monkeypatch, value):
    monkeypatch.setenv("LEDGERLM_KV_OVERCOMMIT", value)
    with pytest.raises(ValidationError, match="kv_overcommit"):
        Settings()
    with pytest.raises(ValueError, match="kv_overcommit"):
        QueueBound(kv_overcommit=0)


def test_the_overcommit_reaches_admissions_bound(monkeypatch):
    monkeypatch.setenv("LEDGERLM_KV_OVERCOMMIT", "1.25")
    assert QueueBound.from_settings(Settings()).kv_overcommit == 1.25
    assert Settings().kv_overcommit == 1.25
