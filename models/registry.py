"""Who is who and what may be used: the state that admin events build.

Pure: `apply` takes an envelope and updates the registry; readers (API, admission,
workers) each keep one and feed it the admin topic.

A retired revision stays in `revisions` (settlement prices what ran on it, usage and
audit name it, running work finishes on it) but can no longer be pinned: `pinnable` and
`resolve_alias` never return it. Retirement is final: a later `ModelRevisionApproved` of
the same name does not bring it back (the admin commands refuse to write one).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timezone

from models.authz import OWN_LIMIT_FIELDS, tighten
from models.engine_settings import EngineSettings
from models.events import Envelope
from models.events_admin import (
    ApiKeyExpirySet, ApiKeyIssued, ApiKeyRevoked, CacheInvalidated, CachePolicySet, EvalScoresRecorded, RouterCleared, RouterSet, ModelAliasDeleted, ModelAliasSet, ModelRevisionApproved,
    ModelRevisionRetired, TenantCreated, TenantLimitsChanged, TenantOwnLimitsChanged, TenantReinstated,
    TenantSuspended,
)
from models.events_rollout import (
    RevisionDrained, RolloutCandidateReplaced, RolloutPaused, RolloutPromoted, RolloutResumed, RolloutRolledBack,
    RolloutStarted, RolloutStepped,
)
from models.quota import Limits
from models.rollout import ARM_CANDIDATE, ARM_STABLE, RolloutState, Route, apply_rollout

# A rollout's own history (its subject is the rollout), then what the registry also applies.
ROLLOUT_STEPS = (RolloutStarted, RolloutStepped, RolloutPaused, RolloutResumed, RolloutPromoted, RolloutRolledBack,
                 RolloutCandidateReplaced)
ROLLOUT_EVENTS = (*ROLLOUT_STEPS, RevisionDrained)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass
class Tenant:
    tenant_id: str
    name: str


@dataclass(frozen=True)
class Principal:
    """What a credential resolves to. The only source of a request's tenant."""

    tenant_id: str
    application_id: str
    key_id: str
    scopes: frozenset[str]


@dataclass
class Revision:
    model_revision: str
    model_path: str
    engine_config_hash: str
    max_model_len: int
    price_input_per_1k_micros: int
    price_output_per_1k_micros: int
    artifact_digests: dict[str, str] | None = None
    artifact_signature: str | None = None
    artifact_signer: str | None = None
    engine_settings: EngineSettings | None = None  # None: approved before revisions had them


@dataclass(frozen=True)
class EvalScore:
    score: float
    samples: int
    source: str
    recorded_at: datetime


@dataclass(frozen=True)
class CachePolicy:
    """A tenant's semantic cache for one alias (`CachePolicySet`); off without one."""

    enabled: bool = False
    threshold: float | None = None
    ttl_s: int = 3600
    sampled_too: bool = False
    price_output_per_1k_micros: int = 0


@dataclass
class Alias:
    alias: str
    model_revision: str
    allowed_tenants: frozenset[str]

    def allows(self, tenant_id: str) -> bool:
        return "*" in self.allowed_tenants or tenant_id in self.allowed_tenants


@dataclass
class Registry:
    tenants: dict[str, Tenant] = field(default_factory=dict)
    keys_by_hash: dict[str, Principal] = field(default_factory=dict)
    revoked: set[str] = field(default_factory=set)
    revisions: dict[str, Revision] = field(default_factory=dict)
    aliases: dict[str, Alias] = field(default_factory=dict)
    limits: dict[str, Limits] = field(default_factory=dict)  # in force; tenants without an entry are unlimited
    retired: dict[str, str | None] = field(default_factory=dict)  # revision -> the reason given, if any
    grants: dict[str, Limits] = field(default_factory=dict)  # the operator's, before the tenant's own
    own_limits: dict[str, dict] = field(default_factory=dict)  # a tenant admin's, within the grant
    expires: dict[str, datetime] = field(default_factory=dict)  # key_id -> when it stops authenticating
    suspended: dict[str, str | None] = field(default_factory=dict)  # tenant -> the reason given, if any
    rollouts: dict[str, RolloutState] = field(default_factory=dict)  # by rollout id, ended ones too
    open_rollouts: dict[str, RolloutState] = field(default_factory=dict)  # by alias: its routing table
    evals: dict[str, dict[str, EvalScore]] = field(default_factory=dict)  # task -> revision -> its latest score
    routers: dict[str, RouterSet] = field(default_factory=dict)  # alias -> its rules and fallbacks
    cache_policies: dict[tuple[str, str], CachePolicy] = field(default_factory=dict)  # (tenant, alias)
    # Invalidations so far by (tenant, alias), alias None for the tenant's every alias.
    cache_epochs: dict[tuple[str, str | None], int] = field(default_factory=dict)

    def apply(self, env: Envelope) -> None:
        p = env.payload
        if isinstance(p, TenantCreated):
            self.tenants.setdefault(p.tenant_id, Tenant(p.tenant_id, p.name))
        elif isinstance(p, ApiKeyIssued):
            self.keys_by_hash[p.secret_sha256] = Principal(
                p.tenant_id, p.application_id, p.key_id, frozenset(p.scopes)
            )
            if p.expires_at is not None:
                self.expires[p.key_id] = p.expires_at
        elif isinstance(p, ApiKeyExpirySet):
            self.expires[p.key_id] = p.expires_at
        elif isinstance(p, ApiKeyRevoked):
            self.revoked.add(p.key_id)
        elif isinstance(p, ModelRevisionApproved):
            if p.model_revision in self.retired:
                return  # retirement is final; its record stays as it was when retired
            self.revisions[p.model_revision] = Revision(
                p.model_revision, p.model_path, p.engine_config_hash, p.max_model_len,
                p.price_input_per_1k_micros, p.price_output_per_1k_micros,
                p.artifact_digests, p.artifact_signature, p.artifact_signer, p.engine_settings,
            )
        elif isinstance(p, ModelAliasSet):
            self.aliases[p.alias] = Alias(p.alias, p.model_revision, frozenset(p.allowed_tenants))
        elif isinstance(p, ModelRevisionRetired):
            if p.model_revision in self.revisions:
                self.retired.setdefault(p.model_revision, p.reason)
        elif isinstance(p, ModelAliasDeleted):
            self.aliases.pop(p.alias, None)
            self.routers.pop(p.alias, None)
        elif isinstance(p, TenantLimitsChanged):
            self.grants[p.tenant_id] = Limits.from_payload(p)
            self.limits[p.tenant_id] = tighten(self.grants[p.tenant_id], self.own_limits.get(p.tenant_id))
        elif isinstance(p, TenantOwnLimitsChanged):
            self.own_limits[p.tenant_id] = {name: getattr(p, name) for name in OWN_LIMIT_FIELDS}
            self.limits[p.tenant_id] = tighten(self.grant_for(p.tenant_id), self.own_limits[p.tenant_id])
        elif isinstance(p, TenantSuspended):
            self.suspended[p.tenant_id] = p.reason
        elif isinstance(p, TenantReinstated):
            self.suspended.pop(p.tenant_id, None)
        elif isinstance(p, ROLLOUT_EVENTS):
            self._apply_rollout(env)
        elif isinstance(p, EvalScoresRecorded):
            for row in p.rows:
                self.evals.setdefault(row.task, {})[row.model_revision] = EvalScore(
                    row.score, row.samples, p.source, env.occurred_at)

        elif isinstance(p, RouterSet):
            self.routers[p.alias] = p
        elif isinstance(p, RouterCleared):
            self.routers.pop(p.alias, None)
        elif isinstance(p, CachePolicySet):
            self.cache_policies[p.tenant_id, p.model_alias] = CachePolicy(
                p.enabled, p.threshold, p.ttl_s, p.sampled_too, p.price_output_per_1k_micros)
        elif isinstance(p, CacheInvalidated):
            key = (p.tenant_id, p.model_alias)
            self.cache_epochs[key] = self.cache_epochs.get(key, 0) + 1

    def cache_policy(self, tenant_id: str, alias: str) -> CachePolicy:
        return self.cache_policies.get((tenant_id, alias), CachePolicy())

    def cache_epoch(self, tenant_id: str, alias: str) -> int:
        """How many invalidations reach the tenant's entries for the alias: an entry made
        under a lower count is dead."""
        return self.cache_epochs.get((tenant_id, alias), 0) + self.cache_epochs.get((tenant_id, None), 0)

    def _apply_rollout(self, env: Envelope) -> None:
        were_open = dict(self.open_rollouts)
        apply_rollout(self.rollouts, self.open_rollouts, env)
        for alias, state in were_open.items():  # promoted now: the alias points at its candidate
            if state.outcome == "promoted" and alias in self.aliases:
                self.aliases[alias] = Alias(alias, state.candidate_revision, self.aliases[alias].allowed_tenants)

    def authenticate(self, secret: str, now: datetime | None = None) -> Principal | None:
        """The key's principal; None for an unknown, revoked or expired key. A suspended
        tenant's keys still resolve (the API refuses them with 403, not 401)."""
        return self.authenticate_digest(hash_secret(secret), now)

    def authenticate_digest(self, secret_sha256: str, now: datetime | None = None) -> Principal | None:
        """As `authenticate`, from the key's hash: what a console session keeps, never the key."""
        principal = self.keys_by_hash.get(secret_sha256)
        if principal is None or principal.key_id in self.revoked or principal.tenant_id not in self.tenants:
            return None
        expires = self.expires.get(principal.key_id)
        if expires is not None and expires <= (now or datetime.now(timezone.utc)):
            return None
        return principal

    def pinnable(self, model_revision: str) -> Revision | None:
        """The revision if new work may be pinned to it: approved and not retired."""
        if model_revision in self.retired:
            return None
        return self.revisions.get(model_revision)

    def resolve_alias(self, alias: str, tenant_id: str, key: str | None = None) -> Revision | None:
        """The revision an alias pins for this tenant; None when unknown, not allowed, or
        pointing at a revision that is retired (`retired_behind` tells that case apart).
        With a stickiness key (`models.rollout.stickiness_key`), an open rollout's choice."""
        route = self.route(alias, tenant_id, key)
        return None if route is None else self.pinnable(route.model_revision)

    def route(self, alias: str, tenant_id: str, key: str | None = None) -> Route | None:
        """Where a request for the alias goes: without a key, or without an open canary, the
        alias's revision; with both, the arm the key is on (stable when the candidate cannot
        be pinned). None when the alias is unknown or not allowed to the tenant."""
        entry = self.aliases.get(alias)
        if entry is None or not entry.allows(tenant_id):
            return None
        rollout = self.open_rollouts.get(alias)
        if rollout is None or key is None:
            return Route(entry.model_revision)
        arm = rollout.arm_for(key)
        if arm == ARM_CANDIDATE and self.pinnable(rollout.candidate_revision) is None:
            arm = ARM_STABLE
        return Route(rollout.revision_of(arm), rollout.rollout_id, arm)

    def retired_behind(self, alias: str, tenant_id: str) -> str | None:
        """The retired revision an alias this tenant may use points at; None otherwise.
        An alias the tenant may not use says nothing, as if it did not exist."""
        entry = self.aliases.get(alias)
        if entry is None or not entry.allows(tenant_id) or entry.model_revision not in self.retired:
            return None
        return entry.model_revision

    def aliases_for(self, tenant_id: str) -> list[Alias]:
        """The aliases this tenant may use now: allowed, and pointing at a pinnable revision."""
        return sorted((a for a in self.aliases.values() if a.allows(tenant_id) and self.pinnable(a.model_revision)),
                      key=lambda a: a.alias)

    def limits_for(self, tenant_id: str) -> Limits:
        """The limits in force: the operator's grant tightened by the tenant's own."""
        return self.limits.get(tenant_id, Limits())

    def grant_for(self, tenant_id: str) -> Limits:
        """What the operator granted, before the tenant's own limits."""
        return self.grants.get(tenant_id, Limits())

    def keys_of(self, tenant_id: str) -> list[Principal]:
        return sorted((p for p in self.keys_by_hash.values() if p.tenant_id == tenant_id), key=lambda p: p.key_id)
