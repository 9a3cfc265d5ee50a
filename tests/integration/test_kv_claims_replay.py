"""KV claims replay from the log: admission restarted claims again exactly what its
predecessor held (per revision, and on the worker that runs each started request), so it
decides alike: past the revision's KV cache and the queue's bound normal priority is shed
as `kv_capacity` before and after the restart, while high priority is still admitted.
Both logs."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone


from models import topics
from models.events import decode, new_event
from models.events_fleet import Capacity, WorkerHeartbeat, WorkerJoined
from models.events_generation import GenerationRequested, GenerationStarted, Position
from pipelines.admin import commands as admin
from pipelines.admin.commands import PLATFORM, RegistryView
from pipelines.admission.processor import AdmissionProcessor
from pipelines.admission.capacity import QueueBound, key_of
from pipelines.publish import publish
from tests.harness import new_tenant
from tests.helpers import wait_until

KV_TOKENS = 1000
CLAIM = 300  # 100 prompt tokens, 200 output: five fill the queue's bound (1500 for normal, 2000 for high)
# Half a KV cache more may wait for normal priority, a whole one for high.
BOUND = QueueBound(per_slot=0.5, kv_overcommit=1.0)


def serving_worker(revision: str, worker_id: str) -> list:
    """A live worker of the revision with a KV cache of `KV_TOKENS` (beating once a minute)."""
    who = dict(worker_id=worker_id, pool=topics.SHARED_POOL, model_revision=revision, engine_config_hash="slow",
               host="h", pid=1, heartbeat_interval_ms=60_000,
               capacity=Capacity(max_seqs=64, kv_cache_tokens=KV_TOKENS, max_model_len=512))
    beat = WorkerHeartbeat(**who, seq=0, running=0, waiting=0, free_slots=64, kv_cache_usage=0.0,
                           output_tokens_per_s=0.0)
    return [new_event(p, tenant_id=PLATFORM, correlation_id=worker_id) for p in (WorkerJoined(**who), beat)]


def ask(tenant_id: str, revision: str, request_id: str, priority: str = "normal"):
    now = datetime.now(timezone.utc)
    req = GenerationRequested(request_id=request_id, model_alias="kv", model_revision=revision, input_tokens=100,
                              input_sha256="0" * 64, max_output_tokens=CLAIM - 100, priority=priority,
                              deadline_at=now + timedelta(seconds=600),
                              prompt_ref=Position(topic="p", partition=0, offset=0))
    return new_event(req, tenant_id=tenant_id, correlation_id=request_id, occurred_at=now)


def first_word(log, request_id: str):
    return next((env.payload for env in map(decode, (r.value for r in log.read_topic(topics.LEDGER.name)))
                 if env.correlation_id == request_id), None)


def running_until(processor: AdmissionProcessor, condition, what: str):
    def polled():
        processor.run_once(0.05)
        return condition()
    return wait_until(polled, 30, what=what)


def decided(log, processor, tenant_id, revision, request_id, priority="normal"):
    publish(log, topics.REQUESTS, [ask(tenant_id, revision, request_id, priority)])
    return running_until(processor, lambda: first_word(log, request_id), f"admission to decide {request_id}")


def admission(log_handles) -> AdmissionProcessor:
    return AdmissionProcessor(log_handles(), RegistryView(log_handles()), grace=timedelta(seconds=5), lost_after_s=300,
                              queue_bound=BOUND)


def test_a_restarted_admission_claims_what_its_predecessor_held_and_decides_alike(log_handles):
    log = log_handles()
    view = RegistryView(log)
    tenant_id, _ = new_tenant(view, may_send_high=True)
    revision, worker_id = f"kv@{uuid.uuid4().hex[:6]}", f"w-{uuid.uuid4().hex[:6]}"
    key = key_of(None, revision)
    admin.approve_model(view, alias="kv", model_revision=revision, model_path="/m", engine_config_hash="slow",
                        max_model_len=512, actor="tests")
    publish(log, topics.FLEET, serving_worker(revision, worker_id))
    first = admission(log_handles)
    running_until(first, lambda: first.fleet.view.complete_at is not None
                  and first.capacity.kv_capacity(key) == KV_TOKENS, "the first admission to read the fleet")
    admitted = [decided(log, first, tenant_id, revision, f"r{i}") for i in range(5)]
    assert [a.event_type for a in admitted] == ["BudgetReserved"] * 5
    before = decided(log, first, tenant_id, revision, "late-1")
    publish(log, topics.OUTCOMES, [new_event(GenerationStarted(request_id=f"r{i}", worker_id=worker_id,
                                                               model_revision=revision, queued_ms=5),
                                             tenant_id=tenant_id, correlation_id=f"r{i}") for i in range(2)])
    running_until(first, lambda: first.claims.sums(key) == (5 * CLAIM, 2 * CLAIM, 0),
                  "the first admission to see two of them start")
    held = (first.claims.sums(key), first.claims.on_worker(worker_id))
    assert held == ((1500, 600, 0), 600)
    first.close()

    restarted = admission(log_handles)
    try:
        running_until(restarted, lambda: restarted.owned and restarted.claims.claims(key) == 5 * CLAIM
                      and restarted.fleet.view.complete_at is not None, "the restarted admission to claim again")
        assert (restarted.claims.sums(key), restarted.claims.on_worker(worker_id)) == held
        after = decided(log, restarted, tenant_id, revision, "late-2")
        high = decided(log, restarted, tenant_id, revision, "urgent", priority="high")
    finally:
        restarted.close()
    for refused in (before, after):
        assert refused.event_type == "GenerationRejected" and refused.reason == "kv_capacity", refused
        assert "would reach 1800 tokens" in refused.message and refused.retry_after_ms >= 1000
    assert high.event_type == "BudgetReserved"
