"""Admission restarted decides with the service rates its predecessor measured: a deadline
the measured pace makes impossible (the floors alone would admit it) is refused alike
before and after the restart, because the new processor folds the outcomes its group had
committed again. Both logs."""
from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta, timezone


from models import topics
from models.events import decode, new_event
from models.events_fleet import Capacity, WorkerHeartbeat, WorkerJoined
from models.events_generation import GenerationCompleted, GenerationRequested, GenerationStarted, Position, Timings
from pipelines.admin import commands as admin
from pipelines.admin.commands import PLATFORM, RegistryView
from pipelines.admission.processor import AdmissionProcessor
from pipelines.admission.capacity import key_of
from pipelines.eventlog import partition_for
from pipelines.publish import publish
from tests.harness import new_tenant
from tests.helpers import wait_until

TOKENS = 11


def serving_worker(revision: str) -> list:
    """A live worker of the revision (two slots, beating once a minute: live all test long)."""
    who = dict(worker_id="w-" + uuid.uuid4().hex[:6], pool=topics.SHARED_POOL, model_revision=revision,
               engine_config_hash="slow", host="h", pid=1, heartbeat_interval_ms=60_000,
               capacity=Capacity(max_seqs=2, kv_cache_tokens=4096, max_model_len=512))
    beat = WorkerHeartbeat(**who, seq=0, running=0, waiting=0, free_slots=2, kv_cache_usage=0.0,
                           output_tokens_per_s=0.0)
    return [new_event(p, tenant_id=PLATFORM, correlation_id=who["worker_id"]) for p in (WorkerJoined(**who), beat)]


def served(tenant_id: str, revision: str, n: int) -> list:
    """What `n` generations of a slow engine left on the outcomes topic: about 1 s to the
    first token, 300 ms a token after it."""
    out = []
    for i in range(n):
        rid = f"done-{i}"
        out.append(new_event(GenerationStarted(request_id=rid, worker_id="w", model_revision=revision,
                                               queued_ms=100 + i), tenant_id=tenant_id, correlation_id=rid))
        out.append(new_event(GenerationCompleted(
            request_id=rid, finish_reason="length", input_tokens=5, output_tokens=TOKENS, model_revision=revision,
            output_sha256="x", timings=Timings(queued_ms=100, ttft_ms=1000 + 10 * i, duration_ms=4000 + 20 * i)),
            tenant_id=tenant_id, correlation_id=rid))
    return out


def ask(tenant_id: str, revision: str, request_id: str):
    now = datetime.now(timezone.utc)
    req = GenerationRequested(request_id=request_id, model_alias="slow", model_revision=revision, input_tokens=5,
                              input_sha256="0" * 64, max_output_tokens=TOKENS, deadline_at=now + timedelta(seconds=3),
                              prompt_ref=Position(topic="p", partition=0, offset=0))
    return new_event(req, tenant_id=tenant_id, correlation_id=request_id, occurred_at=now)


def running_until(processor: AdmissionProcessor, condition, what: str):
    """Runs `processor` a poll at a time until `condition()` holds (returning it)."""
    def polled():
        processor.run_once(0.05)
        return condition()
    return wait_until(polled, 30, what=what)


def decision(log, processor: AdmissionProcessor, tenant_id: str, revision: str, request_id: str):
    """What `processor` decides for a request of the revision's whole service, due in 3 s."""
    publish(log, topics.REQUESTS, [ask(tenant_id, revision, request_id)])
    return running_until(processor, lambda: next(
        (env.payload for env in map(decode, (r.value for r in log.read_topic(topics.LEDGER.name)))
         if env.correlation_id == request_id), None), f"admission to decide {request_id}")


def test_a_restarted_admission_decides_with_the_rates_it_had_measured(log_handles):
    log = log_handles()
    view = RegistryView(log)
    tenant_id, _ = new_tenant(view)
    revision = f"slow@{uuid.uuid4().hex[:6]}"
    admin.approve_model(view, alias="slow", model_revision=revision, model_path="/m", engine_config_hash="slow",
                        max_model_len=512, actor="tests")
    publish(log, topics.FLEET, serving_worker(revision))
    first = AdmissionProcessor(log_handles(), RegistryView(log_handles()), grace=timedelta(seconds=5), lost_after_s=300)
    publish(log, topics.OUTCOMES, served(tenant_id, revision, 8))
    key, outcomes = key_of(None, revision), partition_for(tenant_id, log.partitions(topics.OUTCOMES.name))
    running_until(first, lambda: first.capacity.rates_of(key).ttft_ms is not None
                  and first.fleet.view.complete_at is not None, "the first admission to measure the pace")
    before = decision(log, first, tenant_id, revision, "late-1")  # its unit commits the outcomes read with it
    measured, queue_ms = first.capacity.rates_of(key), first.estimate.queue_ms
    committed = first._consumer.committed(topics.OUTCOMES.name, outcomes)  # noqa: SLF001
    assert committed == log.end_offset(topics.OUTCOMES.name, outcomes)
    first.close()

    restarted = AdmissionProcessor(log_handles(), RegistryView(log_handles()), grace=timedelta(seconds=5),
                                   lost_after_s=300)
    try:
        running_until(restarted, lambda: outcomes in (restarted.owned or ()) and restarted.fleet.view.complete_at
                      is not None, "the restarted admission to own the tenant's partition")
        assert restarted.capacity.rates_of(key) == measured and restarted.estimate.queue_ms == queue_ms
        after = decision(log, restarted, tenant_id, revision, "late-2")
    finally:
        restarted.close()
    # About 4 s to serve against a deadline 3 s away (the floors: 10 ms): refused, alike.
    for refused in (before, after):
        assert refused.event_type == "GenerationRejected" and refused.reason == "deadline", refused
    serve = [re.search(r"take (\d+) ms more", r.message).group(1) for r in (before, after)]
    assert serve[0] == serve[1] and int(serve[0]) > 3000, serve
