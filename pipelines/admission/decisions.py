"""What admission writes for the decisions that end at once: a request's price, a
rejection (to the ledger, and to the stream where the API waits), and a request the API
found in the semantic cache, settled at the cache's price with nothing queued."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from models import topics
from models.events import Envelope, caused_by
from models.events_generation import (
    BudgetReserved, CacheHit, GenerationRejected, GenerationRequested, ReservationReleased, UsageSettled,
)
from models.quota import Ask, Reject, decide
from models.registry import Registry, Revision
from models.reservations import ReservationBook
from pipelines.publish import Outputs


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def cost_micros(revision: Revision | None, input_tokens: int, output_tokens: int) -> int:
    """Price of the tokens; a partial thousand is charged, never rounded away."""
    if revision is None:
        return 0
    return (_ceil_div(input_tokens * revision.price_input_per_1k_micros, 1000)
            + _ceil_div(output_tokens * revision.price_output_per_1k_micros, 1000))


def reject(env: Envelope, decision: Reject, *, book: ReservationBook, now: datetime) -> Outputs:
    """To the ledger (the record) and the stream (the API waits there for its request)."""
    req: GenerationRequested = env.payload
    rejected = caused_by(env, GenerationRejected(request_id=req.request_id, reason=decision.reason,
                                                 message=decision.message, retry_after_ms=decision.retry_after_ms),
                         occurred_at=now)
    book.rejected(req.request_id)
    return [(topics.LEDGER, rejected), (topics.STREAM, rejected)]


def answer_from_cache(env: Envelope, *, limits, registry: Registry, book: ReservationBook, now: datetime,
                      grace: timedelta) -> Outputs:
    """A request the API found in the semantic cache: decided against the tenant's limits
    like any other (a hit is a request and serves tokens), but priced at the tenant's cache
    price and settled at once, with nothing queued: no reservation of the full generation
    outlives the decision. `CacheHit` goes to the stream first, where the API waits."""
    req: GenerationRequested = env.payload
    ref = req.cache
    policy = registry.cache_policy(env.tenant_id, req.model_alias)
    cost = _ceil_div(ref.output_tokens * policy.price_output_per_1k_micros, 1000)
    ask = Ask(input_tokens=req.input_tokens, max_output_tokens=ref.output_tokens, cost_micros=cost,
              deadline_at=req.deadline_at)
    decision = decide(ask, book.usage_of(env.tenant_id), limits, now)
    if isinstance(decision, Reject):
        return reject(env, decision, book=book, now=now)
    reservation_id = "res_" + uuid.uuid4().hex[:16]
    reserved = caused_by(env, BudgetReserved(
        request_id=req.request_id, reservation_id=reservation_id, tokens=ask.tokens, cost_micros=cost,
        expires_at=now + grace, model_revision=req.model_revision), occurred_at=now)
    hit = caused_by(env, CacheHit(
        request_id=req.request_id, entry_id=ref.entry_id, source_request_id=ref.source_request_id,
        model_alias=req.model_alias, model_revision=req.model_revision, similarity=ref.similarity,
        threshold=ref.threshold, input_tokens=req.input_tokens, saved_output_tokens=ref.output_tokens,
        finish_reason=ref.finish_reason, cost_micros=cost), occurred_at=now)
    settled = caused_by(env, UsageSettled(
        request_id=req.request_id, reservation_id=reservation_id, terminal_status="completed",
        input_tokens=req.input_tokens, output_tokens=ref.output_tokens, cost_micros=cost, cached=True),
        occurred_at=now)
    released = caused_by(env, ReservationReleased(request_id=req.request_id, reservation_id=reservation_id,
                                                  released_tokens=0, released_cost_micros=0), occurred_at=now)
    book.apply(reserved)
    book.apply(settled)
    return [(topics.LEDGER, reserved), (topics.LEDGER, hit), (topics.STREAM, hit), (topics.LEDGER, settled),
            (topics.LEDGER, released)]
