"""Admin changes are events too: tenants, keys, limits, model revisions and aliases.

Key secrets never appear here: only their SHA-256 and a short public prefix.
"""
from __future__ import annotations

import inspect
from datetime import datetime
from typing import Literal

from pydantic import Field, create_model

from models.engine_settings import EngineSettings
from models.event_types import Payload, event
from models.limits import LIMITS, LimitSpec, event_field

# `operator` manages the platform (every tenant, models, fleet, rollouts); `admin` is its
# older name and means the same. `tenant_admin` manages its own tenant (models.authz).
Scope = Literal["generate", "batch", "usage", "audit", "admin", "operator", "tenant_admin"]
ALL_SCOPES: tuple[Scope, ...] = ("generate", "batch", "usage", "audit", "admin", "operator", "tenant_admin")


@event("TenantCreated")
class TenantCreated(Payload):
    tenant_id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    name: str
    actor: str


@event("ApiKeyIssued")
class ApiKeyIssued(Payload):
    key_id: str
    tenant_id: str
    application_id: str = "default"
    secret_sha256: str
    scopes: tuple[Scope, ...]
    actor: str
    # Came later: absent, they are left out of the bytes, so older events encode as before.
    expires_at: datetime | None = Field(default=None, exclude_if=lambda v: v is None)
    rotated_from: str | None = Field(default=None, exclude_if=lambda v: v is None)  # the key it replaces


@event("ApiKeyRevoked")
class ApiKeyRevoked(Payload):
    key_id: str
    tenant_id: str
    actor: str


@event("ModelRevisionApproved")
class ModelRevisionApproved(Payload):
    """A pinned revision: the model directory plus the engine config that shapes output."""

    model_revision: str
    model_path: str
    engine_config_hash: str
    max_model_len: int = Field(gt=0)
    price_input_per_1k_micros: int = Field(default=0, ge=0)
    price_output_per_1k_micros: int = Field(default=0, ge=0)
    actor: str
    # SHA-256 of each file in the model directory when it was approved (pipelines.artifacts);
    # absent on revisions approved without them, which are served unchecked.
    artifact_digests: dict[str, str] | None = Field(default=None, exclude_if=lambda v: v is None)
    artifact_signature: str | None = Field(default=None, exclude_if=lambda v: v is None)
    artifact_signer: str | None = Field(default=None, exclude_if=lambda v: v is None)  # the trusted key's id
    # How the engine runs it (`models.engine_settings`); absent on revisions approved before
    # there were any, which run as they always did: float32, eager, the worker's KV cache.
    engine_settings: EngineSettings | None = Field(default=None, exclude_if=lambda v: v is None)


@event("ModelAliasSet")
class ModelAliasSet(Payload):
    """Points an alias at a revision, for every tenant (tenant_id '*') or for one."""

    alias: str
    model_revision: str
    allowed_tenants: tuple[str, ...] = ("*",)
    actor: str


@event("ModelRevisionRetired")
class ModelRevisionRetired(Payload):
    """A revision is no longer pinned for new work: aliases pointing at it resolve to
    nothing, and requests already pinned to it are rejected. Work already running on it
    finishes, and usage and audit keep naming it. Final: the revision is never approved
    again (approve its model under a new revision name instead)."""

    model_revision: str
    actor: str
    reason: str | None = None


@event("ModelAliasDeleted")
class ModelAliasDeleted(Payload):
    """An alias is gone, for every tenant; the revision it pointed at is untouched."""

    alias: str
    actor: str


def _limits_event(name: str, specs: tuple[LimitSpec, ...], doc: str) -> type[Payload]:
    """An admin event carrying limits, a field per catalogue entry: the tenant, the limits
    of the events' first shape, the actor, then the limits that came later (left out of
    the bytes while unset, so older events encode as before)."""
    fields = {"tenant_id": (str, ...),
              **{spec.name: event_field(spec) for spec in specs if not spec.late},
              "actor": (str, ...),
              **{spec.name: event_field(spec) for spec in specs if spec.late}}
    return event(name)(create_model(name, __base__=Payload, __doc__=inspect.cleandoc(doc), __module__=__name__,
                                    **fields))


TenantLimitsChanged = _limits_event("TenantLimitsChanged", LIMITS, """\
    A tenant's complete limits after the change (not a patch), so the latest event alone
    says what applies: a field per limit of the catalogue (`models.limits`). None means
    unlimited, or the limit's default: `window_seconds` None is the default window
    (`models.limits.DEFAULT_WINDOW_S`), `pool` None the shared pool, `fair_share_weight`
    None 1.0 and `may_send_high` None not entitled. Limits that came later (the last two,
    and any added since) are left out of the bytes when None, so older events encode as
    before.""")

TenantOwnLimitsChanged = _limits_event("TenantOwnLimitsChanged", tuple(spec for spec in LIMITS if spec.own), """\
    Limits a tenant admin set for its own tenant, complete after the change (None: no
    limit of its own): the catalogue's limits marked `own`. They only tighten the
    operator's grant (`TenantLimitsChanged`): what applies is the lower of the two
    (`models.authz.tighten`).""")


@event("ApiKeyExpirySet")
class ApiKeyExpirySet(Payload):
    """A key stops authenticating at `expires_at` (a rotation sets it on the old key, so
    both keys are live until then)."""

    key_id: str
    tenant_id: str
    expires_at: datetime
    actor: str


@event("TenantSuspended")
class TenantSuspended(Payload):
    """Every key of the tenant is refused (403) from now on, and its running and queued
    generations are cancelled and settled by admission."""

    tenant_id: str
    actor: str
    reason: str | None = None


@event("TenantReinstated")
class TenantReinstated(Payload):
    tenant_id: str
    actor: str


class EvalRow(Payload):
    task: str = Field(min_length=1, max_length=128)
    model_revision: str = Field(min_length=1, max_length=200)
    score: float = Field(ge=0, le=1)  # e.g. the share of the task's eval cases passed
    samples: int = Field(default=1, ge=1)  # the cases the score rests on


@event("EvalScoresRecorded")
class EvalScoresRecorded(Payload):
    """Rows of an eval table an operator uploaded: per task and revision, a quality score in
    [0, 1]. A later row for the same task and revision replaces the earlier one. Rollout
    guardrails compare a candidate's scores with stable's; routing reads them too."""

    source: str = Field(min_length=1, max_length=200)  # the eval run or file the rows come from
    rows: tuple[EvalRow, ...] = Field(min_length=1, max_length=10_000)
    actor: str


@event("CachePolicySet")
class CachePolicySet(Payload):
    """Whether a tenant's requests for an alias may be answered from the semantic cache
    (`pipelines.cache.semantic`), and how: off unless an event turns it on. `threshold`
    raises the platform's similarity floor for this tenant (it never lowers it);
    `sampled_too` lets answers sampled at a temperature above 0 be cached and served again;
    a hit is charged `price_output_per_1k_micros` a thousand of the output tokens it serves."""

    tenant_id: str
    model_alias: str = Field(min_length=1, max_length=128)
    enabled: bool
    threshold: float | None = Field(default=None, ge=0, le=1)
    ttl_s: int = Field(default=3600, gt=0, le=30 * 24 * 3600)
    sampled_too: bool = False
    price_output_per_1k_micros: int = Field(default=0, ge=0)
    actor: str


@event("CacheInvalidated")
class CacheInvalidated(Payload):
    """Every cached answer of the tenant for the alias (every alias, with None) written
    before this event is dead from now on."""

    tenant_id: str
    model_alias: str | None = None
    actor: str
    reason: str | None = None


class RouteRule(Payload):
    """One rule of a router alias (`models.router`). Its match fields, where given, must all
    hold. A static rule names the `revision` to use; a dynamic rule names an eval `task`
    and the `revisions` to choose from: the cheapest whose score for the task (for the
    request's difficulty band, `task/easy` or `task/hard`, when the table has one) clears
    `bar`. Without eval data for the task the dynamic rule does not apply."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    tenant: str | None = None
    application: str | None = None
    endpoint: Literal["generations", "chat.completions", "completions"] | None = None
    tag: str | None = Field(default=None, max_length=64)
    revision: str | None = None
    task: str | None = Field(default=None, max_length=128)
    revisions: tuple[str, ...] = ()
    bar: float | None = Field(default=None, ge=0, le=1)
    # Difficulty: a prompt of at least this many input tokens, or with one of these words
    # (case-insensitive), is `hard`; any other is `easy`.
    hard_input_tokens: int | None = Field(default=None, gt=0)
    hard_words: tuple[str, ...] = ()


@event("RouterSet")
class RouterSet(Payload):
    """An alias becomes a router over approved revisions: its rules in order (the first
    that applies chooses), then the alias's own revision. `fallbacks`: smaller revisions
    to downgrade to, in order, when the chosen one has no capacity (the overload ladder)."""

    alias: str = Field(min_length=1, max_length=128)
    rules: tuple[RouteRule, ...] = Field(default=(), max_length=100)
    fallbacks: tuple[str, ...] = Field(default=(), max_length=8)
    actor: str


@event("RouterCleared")
class RouterCleared(Payload):
    alias: str
    actor: str
