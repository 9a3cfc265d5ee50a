"""Events of one interactive generation, from request to settlement.

Which topic carries which event is decided in `models.topics`; text (prompt and
completion deltas) only ever appears in `PromptSubmitted` and `TokensEmitted`, which
live on bounded-retention topics.
"""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from models.event_types import Payload, event

Priority = Literal["high", "normal", "batch"]
FinishReason = Literal["stop", "length"]
RejectReason = Literal[
    "rate", "concurrency", "tokens", "spend", "input_too_large", "output_too_large",
    "deadline", "unknown_model", "tenant_disabled", "model_retired", "priority_not_allowed",
    "shed", "no_capacity",  # the live fleet's, not the tenant's: load shed, no worker serves it
    "kv_capacity",  # the fleet's too: the revision's KV cache is claimed past what it queues in time
    "shadow_dropped",  # a shadow rollout's copy, for which the candidate had no free slot
]


class Position(Payload):
    """Where a record sits on the log."""

    topic: str
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)


class Timings(Payload):
    queued_ms: int = Field(default=0, ge=0)
    ttft_ms: int | None = Field(default=None, ge=0)
    duration_ms: int = Field(default=0, ge=0)


class StructuredOutput(Payload):
    """What the output must be: any JSON object, or JSON that validates against a schema
    (the client's schema as JSON text, its keys in the client's order, which is the order
    the engine writes properties in). Checked by the API before anything is reserved."""

    kind: Literal["json_object", "json_schema"]
    json_schema: str | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _schema_with_its_kind(self):
        if (self.kind == "json_schema") != (self.json_schema is not None):
            raise ValueError("a structured output has a json_schema when its kind is 'json_schema', and only then")
        return self


class Sampling(Payload):
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # Absent (and left out of the bytes, so older events encode as before): free text.
    structured_output: StructuredOutput | None = Field(default=None, exclude_if=lambda v: v is None)
    # Log probabilities asked for: each output token's, with this many of the likeliest
    # alternatives (0: the token's own only). Absent (and left out of the bytes): none asked.
    logprobs: int | None = Field(default=None, ge=0, le=20, exclude_if=lambda v: v is None)


@event("PromptSubmitted")
class PromptSubmitted(Payload):
    request_id: str
    prompt: str


class CacheRef(Payload):
    """A semantic cache entry a request is to be answered from (no text: that stays in the
    cache and on the stream)."""

    entry_id: str
    source_request_id: str | None = None  # the generation whose answer it holds
    similarity: float = Field(ge=-1.0, le=1.0)
    threshold: float = Field(ge=0.0, le=1.0)
    output_tokens: int = Field(ge=0)
    finish_reason: FinishReason


@event("GenerationRequested")
class GenerationRequested(Payload):
    request_id: str
    application_id: str = "default"
    key_id: str | None = None
    model_alias: str
    model_revision: str
    input_tokens: int = Field(ge=0)
    input_sha256: str
    max_output_tokens: int = Field(gt=0)
    deadline_at: datetime | None = None
    priority: Priority = "normal"
    sampling: Sampling = Sampling()
    prompt_ref: Position
    # Offset of the request's stream partition when it was submitted: its stream starts here.
    stream_offset: int = Field(default=0, ge=0)
    route: str = "generations"
    # Idempotency-Key (hashed with the tenant) and a hash of route + body; absent (and left
    # out of the bytes, so older events encode as before) when the client sent no key.
    idempotency_key_sha256: str | None = Field(default=None, exclude_if=lambda v: v is None)
    request_sha256: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The rollout whose routing table chose `model_revision`, and the arm ('stable' or
    # 'candidate'); absent (and left out of the bytes) when the alias had none open.
    rollout_id: str | None = Field(default=None, exclude_if=lambda v: v is None)
    rollout_arm: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # A shadow copy (tenant `models.rollout.SHADOW_TENANT`) of the request named here, for a
    # shadow rollout's candidate: dropped rather than queued, its answer seen by nobody.
    shadow_of: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The semantic cache's entry the API found for it: admission settles it at the cache's
    # price and nothing runs (`CacheHit`); absent (and left out of the bytes) otherwise.
    cache: CacheRef | None = Field(default=None, exclude_if=lambda v: v is None)
    # A router alias's rule that chose `model_revision` (`models.router`; 'fallback' for a
    # downgrade), and the request this one falls back from (the overload ladder: that one
    # was refused for capacity, so nothing of it was charged); absent (left out) otherwise.
    route_rule: str | None = Field(default=None, exclude_if=lambda v: v is None)
    fallback_from: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # A keyed digest of the tenant and the prompt's leading part (a chat's system prompt):
    # requests that share it tend to wait on one work partition, so one worker's prefix
    # cache serves them (`pipelines.admission.placement`); absent (and left out of the bytes) otherwise.
    affinity: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The request_id its client chose (`request_id` is derived from it with the tenant), so
    # answers can echo it; absent (and left out of the bytes) when the client chose none.
    chosen_request_id: str | None = Field(default=None, exclude_if=lambda v: v is None)


# Output tokens the API had sent its client when it went away (reason `client_gone`): the
# charge stays what the engine generated, the usage shows both. Absent (and left out of
# the bytes, so older events encode as before) for every other end.
def delivered_field():
    return Field(default=None, ge=0, exclude_if=lambda v: v is None)


@event("CancelRequested")
class CancelRequested(Payload):
    request_id: str
    reason: Literal["client", "client_gone", "deadline", "admin"] = "client"
    delivered_output_tokens: int | None = delivered_field()


@event("OutputDelivered")
class OutputDelivered(Payload):
    """The client of a request went away before its end reached it, and no cancel followed:
    the generation ended inside the reconnect grace (or was streamed again). What the
    client had received by then; the charge stays what the engine generated."""
    request_id: str
    delivered_output_tokens: int = Field(ge=0)


@event("BudgetReserved")
class BudgetReserved(Payload):
    request_id: str
    reservation_id: str
    tokens: int = Field(ge=0)
    cost_micros: int = Field(ge=0)
    expires_at: datetime
    model_revision: str = ""


@event("GenerationAdmitted")
class GenerationAdmitted(Payload):
    request_id: str
    reservation_id: str
    work_topic: str


@event("GenerationRejected")
class GenerationRejected(Payload):
    request_id: str
    reason: RejectReason
    message: str
    retry_after_ms: int | None = Field(default=None, ge=0)


@event("GenerationQueued")
class GenerationQueued(Payload):
    """The work item a pool worker takes: the request plus what admission decided."""

    request: GenerationRequested
    reservation_id: str
    queued_at: datetime
    # The tenant's fair-share weight when admitted, so a worker weighs its queue without
    # reading the registry; absent (and left out of the bytes) on work queued before
    # weights existed, which weighs 1.0.
    fair_share_weight: float | None = Field(default=None, gt=0, exclude_if=lambda v: v is None)
    # The work topic's partition admission placed it on (`pipelines.admission.placement`); absent (and
    # left out of the bytes) where the request id's hash places it, as before placement.
    work_partition: int | None = Field(default=None, ge=0, exclude_if=lambda v: v is None)


@event("GenerationStarted")
class GenerationStarted(Payload):
    request_id: str
    worker_id: str
    # The revision of the worker that runs it (only workers of the pinned revision take its
    # work), and the config hash of the engine that worker really loaded; absent (and left
    # out of the bytes) on starts written before workers announced their engine.
    model_revision: str
    queued_ms: int = Field(ge=0)
    engine_config_hash: str | None = Field(default=None, exclude_if=lambda v: v is None)


class TopLogprob(Payload):
    token: str
    logprob: float


class TokenLogprob(Payload):
    """One output token's log probability, and the likeliest alternatives at its place
    (as many as the request asked for, likeliest first)."""

    token: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@event("TokensEmitted")
class TokensEmitted(Payload):
    request_id: str
    seq: int = Field(ge=0)
    text: str
    token_count: int = Field(ge=0)
    # One entry a token, for a request that asked for log probabilities (`Sampling.logprobs`);
    # absent (and left out of the bytes) for every other request.
    logprobs: tuple[TokenLogprob, ...] | None = Field(default=None, exclude_if=lambda v: v is None)


@event("GenerationCompleted")
class GenerationCompleted(Payload):
    request_id: str
    finish_reason: FinishReason
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    model_revision: str
    output_sha256: str
    timings: Timings
    # Served from the semantic cache (written by the API after admission's `CacheHit`);
    # absent (and left out of the bytes) on every generation an engine ran.
    cached: bool | None = Field(default=None, exclude_if=lambda v: v is None)


@event("CacheHit")
class CacheHit(Payload):
    """Admission accepted a request answered from the semantic cache: which entry, how
    alike, the output tokens its engine did not have to make, and what the hit cost the
    tenant (the cache price, 0 by default). On the ledger and, first, on the stream, where
    the API follows it with the cached text."""

    request_id: str
    entry_id: str
    source_request_id: str | None = None
    model_alias: str
    model_revision: str
    similarity: float
    threshold: float
    input_tokens: int = Field(ge=0)
    saved_output_tokens: int = Field(ge=0)
    finish_reason: FinishReason
    cost_micros: int = Field(ge=0)


@event("GenerationFailed")
class GenerationFailed(Payload):
    request_id: str
    error_code: str
    message: str
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    timings: Timings = Timings()
    # Of the output tokens, those on the stream topic when it failed (what its client could
    # get), where fewer than all: an append of the stream failed (`log_unavailable`).
    delivered_output_tokens: int | None = delivered_field()


@event("GenerationCancelled")
class GenerationCancelled(Payload):
    request_id: str
    reason: Literal["client", "client_gone", "deadline", "admin"]
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    timings: Timings = Timings()
    delivered_output_tokens: int | None = delivered_field()


@event("UsageSettled")
class UsageSettled(Payload):
    request_id: str
    reservation_id: str
    terminal_status: Literal["completed", "failed", "cancelled", "expired"]
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)  # generated by the engine, and charged
    cost_micros: int = Field(ge=0)
    # Of those, the ones its client received, where it went away early; absent: all of them.
    delivered_output_tokens: int | None = delivered_field()
    # Answered from the semantic cache, charged at its price; absent (left out) otherwise.
    cached: bool | None = Field(default=None, exclude_if=lambda v: v is None)


@event("ReservationReleased")
class ReservationReleased(Payload):
    request_id: str
    reservation_id: str
    released_tokens: int = Field(ge=0)
    released_cost_micros: int = Field(ge=0)


@event("ReservationExpired")
class ReservationExpired(Payload):
    request_id: str
    reservation_id: str


TERMINAL_TYPES = frozenset({"GenerationCompleted", "GenerationFailed", "GenerationCancelled"})
