"""The autoscaling signals admission exports per pool and revision: the desired replica count
is the capacity planner's arithmetic on what was measured lately (arrivals, request size,
service time, slots and KV), plus one spare; KV pressure; and each signal as a gauge."""
from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from models import topics
from models.capacity_plan import replica_plan
from models.events import new_event
from models.events_generation import BudgetReserved, GenerationAdmitted, UsageSettled
from models.fleet import PoolCapacity
from models.registry import Alias, Registry
from pipelines.admission.signals import Demand, kv_pressure, pool_of, replica_need
from pipelines.admission.capacity import CapacityBook, QueueBound, ServiceRates, key_of
from pipelines.admission.metrics import AdmissionMetrics

REV = "tiny@abc"
T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


def pool(workers=2, slots=8, kv=0) -> PoolCapacity:
    return PoolCapacity(workers=workers, max_seqs=slots, free_slots=slots, kv_cache_tokens=kv)


@pytest.mark.parametrize("pool_name", [None, "interactive", "gold", "team-a-b"])
@pytest.mark.parametrize("priority", ["high", "normal"])
def test_the_pool_is_read_back_from_its_work_topic(pool_name, priority):
    name = topics.work_topic(pool_name, priority, REV).name
    assert pool_of(name, REV) == (pool_name or topics.SHARED_POOL)
    assert pool_of(name, "tiny@other") is None
    assert pool_of(topics.LEDGER.name, REV) is None


def test_desired_replicas_are_the_planners_with_one_spare():
    # 4 slots a replica, 100 output tokens in 2 s: 200 tokens/s a replica; 10 req/s x 100 tokens = 1000 tokens/s.
    need = replica_need(pool(workers=2, slots=8), arrivals_per_s=10, output_tokens=100, input_tokens=20,
                        service_ms=2000, ceiling=0.5)
    assert need.demand_tokens_per_s == 1000 and need.goodput_tokens_per_s == 200
    assert need.desired == math.ceil(1000 / (200 * 0.5)) + 1 == 11
    plan = replica_plan(peak_requests_per_s=10, output_tokens_per_request=100, per_replica_tokens_per_s=200,
                        ceiling=0.5, failures=1)
    assert need.desired == plan.replicas


def test_a_kv_cache_smaller_than_the_slots_lowers_the_goodput():
    # 8 slots a replica, but 1,200 KV tokens hold only 2 requests of 100 + 500 tokens.
    need = replica_need(pool(workers=1, slots=8, kv=1200), arrivals_per_s=1, output_tokens=500, input_tokens=100,
                        service_ms=5000, ceiling=1.0)
    assert need.goodput_tokens_per_s == pytest.approx(2 * 500 / 5)
    assert need.desired == math.ceil(500 / 200) + 1


def test_without_demand_one_replica_and_its_spare_and_unmeasured_holds_what_serves():
    idle = replica_need(pool(workers=5), arrivals_per_s=0, output_tokens=100, input_tokens=1, service_ms=1000,
                        ceiling=0.7)
    assert idle.desired == 2
    unmeasured = replica_need(pool(workers=5), arrivals_per_s=3, output_tokens=None, input_tokens=None,
                              service_ms=None, ceiling=0.7)
    assert (unmeasured.demand_tokens_per_s, unmeasured.goodput_tokens_per_s, unmeasured.desired) == (None, None, 5)
    assert replica_need(None, arrivals_per_s=3, output_tokens=10, input_tokens=1, service_ms=None,
                        ceiling=0.7).desired == 2


def test_kv_pressure_is_the_claims_over_the_kv_admitted_at_once():
    key = key_of(None, REV)
    book = CapacityBook(FakeFleet({key: pool(kv=4000)}), bound=QueueBound(kv_overcommit=1.5))
    book.kv_claims.hold("r1", key, 3000)
    assert kv_pressure(book, key) == 3000 / 6000
    assert kv_pressure(CapacityBook(FakeFleet({key: pool(kv=0)})), key) is None
    assert kv_pressure(CapacityBook(None), key) is None


def test_arrivals_are_counted_over_the_window():
    now = [100.0]
    demand = Demand(10.0, clock=lambda: now[0])
    key = key_of(None, REV)
    now[0] = 120.0  # started 20 s ago: the whole window counts
    for i in range(5):
        demand.admitted(f"r{i}", key)
    assert demand.arrivals_per_s(key) == 0.5
    now[0] = 131.0
    assert demand.arrivals_per_s(key) == 0.0
    demand.settled("r0", "completed", 10, 40)
    demand.settled("r1", "completed", 20, 60)
    demand.settled("r2", "failed", 99, 0)  # only completed requests size the demand
    assert demand.sizes(key) == (40 + 0.2 * 20, 10 + 0.2 * 10)


class FakeFleet:
    def __init__(self, capacity):
        self._capacity, self.complete_at = capacity, T0

    def capacity(self):
        return self._capacity

    def all(self):
        return []

    def refresh(self):
        return self


def admitted(request_id: str, revision: str, pool_name: str | None):
    env = new_event(BudgetReserved(request_id=request_id, reservation_id="res", tokens=10, cost_micros=0,
                                   expires_at=T0 + timedelta(hours=1), model_revision=revision),
                    tenant_id="t", correlation_id=request_id)
    work = topics.work_topic(pool_name, "normal", revision)
    return [(topics.LEDGER, env), (topics.LEDGER, new_event(GenerationAdmitted(
        request_id=request_id, reservation_id="res", work_topic=work.name), tenant_id="t", correlation_id=request_id))]


def test_admission_exports_each_signal_per_pool_and_revision():
    key = key_of(None, REV)
    book = CapacityBook(FakeFleet({key: pool(workers=2, slots=8, kv=1000)}), clock=lambda: T0)
    book.kv_claims.hold("waiting", key, 950)
    book.rates[key] = ServiceRates(service_ms=1000.0)
    book.queued("waiting", key, "normal")
    registry = Registry(aliases={"tiny": Alias("tiny", REV, frozenset("*")),
                                 "idle": Alias("idle", "idle@1", frozenset("*"))})
    processor = SimpleNamespace(capacity=book, book=SimpleNamespace(open={}),
                                registry=registry)
    metrics = AdmissionMetrics(ceiling=0.5, window_s=30).follow(processor)
    metrics.written(admitted("r1", REV, None))
    metrics.written([(topics.LEDGER, new_event(UsageSettled(
        request_id="r1", reservation_id="res", terminal_status="completed", input_tokens=5, output_tokens=10,
        cost_micros=0), tenant_id="t", correlation_id="r1"))])
    text = generate_latest(metrics.registry).decode()
    labels = f'{{pool="interactive",revision="{REV}"}}'
    assert f"ledgerlm_admission_queue_depth{labels} 1.0" in text
    assert f"ledgerlm_admission_oldest_queued_age_seconds{labels}" in text
    assert f"ledgerlm_admission_kv_pressure{labels} 0.95" in text
    assert f"ledgerlm_admission_demand_output_tokens_per_second{labels}" in text
    assert f"ledgerlm_replica_goodput_output_tokens_per_second{labels}" in text
    assert f"ledgerlm_desired_replicas{labels}" in text
    assert "ledgerlm_autoscale_utilization_ceiling 0.5" in text
    assert f'ledgerlm_alias_serving_workers{{alias="tiny",revision="{REV}"}} 2.0' in text
    assert 'ledgerlm_alias_serving_workers{alias="idle",revision="idle@1"} 0.0' in text


def test_a_bad_ceiling_is_refused():
    with pytest.raises(ValueError, match="ceiling"):
        AdmissionMetrics(ceiling=1.5)
