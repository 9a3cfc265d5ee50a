"""Deciding one request (`handle_requested`): admitted, it is reserved (`BudgetReserved`),
admitted (`GenerationAdmitted`) and queued on its pinned revision's work topic
(`GenerationQueued`); otherwise rejected with the reason (`pipelines.admission.decisions`).
The checks in order: the tenant (known, not suspended), the revision (approved, not
retired), the priority allowed, the semantic cache's answer, the quota (`models.quota`),
a shadow copy's free slot, and the live fleet's capacity (`pipelines.admission.capacity`).
Pure apart from the book it reserves in; the processor (`pipelines.admission.processor`)
writes what it returns.
"""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from models import topics
from models.events import Envelope, caused_by
from models.events_generation import BudgetReserved, GenerationAdmitted, GenerationQueued, GenerationRequested
from models.quota import Ask, Reject, decide
from models.registry import Registry
from models.reservations import ReservationBook
from models.rollout import SHADOW_TENANT
from pipelines.admission.capacity import CapacityBook, ServiceEstimate, key_of
from pipelines.admission.decisions import answer_from_cache, cost_micros, reject
from pipelines.publish import Outputs

UNBOUNDED_DEADLINE = timedelta(minutes=10)  # a request without a deadline expires after this plus grace


def handle_requested(
    env: Envelope, *, registry: Registry, book: ReservationBook, now: datetime, grace: timedelta,
    estimate: ServiceEstimate | None = None, queued_at: datetime | None = None,
    capacity: CapacityBook | None = None,
) -> Outputs:
    """Decides at `now` (the request's time); `queued_at` is when the work really queued (the
    wall clock), which workers measure queue time from. `capacity`: the live fleet's, which
    refuses what it cannot serve in time (`pipelines.admission.capacity`)."""
    req: GenerationRequested = env.payload
    if book.decided(req.request_id):
        return []  # the same request delivered twice is decided once
    shadow = req.shadow_of is not None and env.tenant_id == SHADOW_TENANT
    if env.tenant_id not in registry.tenants and not shadow:
        return reject(env, Reject("tenant_disabled", "this tenant does not exist"), book=book, now=now)
    if env.tenant_id in registry.suspended:
        return reject(env, Reject("tenant_disabled", "this tenant is suspended"), book=book, now=now)
    revision = registry.revisions.get(req.model_revision)
    if revision is None:
        return reject(env, Reject("unknown_model", f"model revision {req.model_revision} is not approved"),
                      book=book, now=now)
    if req.model_revision in registry.retired:  # retired after the request was pinned to it
        return reject(env, Reject("model_retired", f"model revision {req.model_revision} is retired"),
                      book=book, now=now)
    limits = registry.limits_for(env.tenant_id)
    if req.priority == "high" and not limits.may_send_high:  # the API refuses it first; a grant may be lifted since
        return reject(env, Reject("priority_not_allowed", "this tenant may not send priority 'high'"),
                      book=book, now=now)
    if req.cache is not None:
        return answer_from_cache(env, limits=limits, registry=registry, book=book, now=now, grace=grace)
    ask = Ask(input_tokens=req.input_tokens, max_output_tokens=req.max_output_tokens,
              cost_micros=cost_micros(revision, req.input_tokens, req.max_output_tokens),
              deadline_at=req.deadline_at,
              min_service_ms=(estimate or ServiceEstimate()).min_service_ms(req.max_output_tokens))
    decision = decide(ask, book.usage_of(env.tenant_id), limits, now)
    if isinstance(decision, Reject):
        return reject(env, decision, book=book, now=now)
    if shadow and (capacity is None or not capacity.free_now(key_of(limits.pool, req.model_revision),
                                                             asked_at=env.occurred_at)):
        # A shadow copy runs only on a slot free now: it never queues ahead of real work.
        return reject(env, Reject("shadow_dropped", "the candidate has no free slot for a shadow copy"),
                      book=book, now=now)
    if capacity is not None and (refused := capacity.check(req, pool=limits.pool, asked_at=env.occurred_at,
                                                             now=max(now, queued_at or now),
                                                             max_model_len=revision.max_model_len)) is not None:
        return reject(env, refused, book=book, now=now)
    reservation_id = "res_" + uuid.uuid4().hex[:16]
    deadline = req.deadline_at or now + UNBOUNDED_DEADLINE
    reserved = caused_by(env, BudgetReserved(
        request_id=req.request_id, reservation_id=reservation_id, tokens=ask.tokens, cost_micros=ask.cost_micros,
        expires_at=deadline + grace, model_revision=req.model_revision), occurred_at=now)
    # Only workers of the pinned revision read its work topics (revision-true serving).
    work_topic = topics.work_topic(limits.pool, req.priority, req.model_revision)
    admitted = caused_by(env, GenerationAdmitted(
        request_id=req.request_id, reservation_id=reservation_id, work_topic=work_topic.name), occurred_at=now)
    queued = caused_by(env, GenerationQueued(request=req, reservation_id=reservation_id,
                                             queued_at=max(now, queued_at or now),
                                             fair_share_weight=limits.fair_share_weight), occurred_at=now)
    book.apply(reserved)
    return [(topics.LEDGER, reserved), (topics.LEDGER, admitted), (work_topic, queued)]
