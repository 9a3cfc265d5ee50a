"""Admin commands and the registry view every process keeps of the admin topic."""
from __future__ import annotations

import secrets
import threading
import time
import uuid
from typing import Iterable

from pydantic import ValidationError

from models import engine_settings as engines
from models import topics
from models.events import Envelope, decode, encode, new_event
from models.events_admin import (
    ALL_SCOPES, ApiKeyIssued, ApiKeyRevoked, ModelAliasDeleted, ModelAliasSet, ModelRevisionApproved,
    ModelRevisionRetired, TenantCreated, TenantLimitsChanged,
)
from models.quota import LIMIT_FIELDS, MAX_WINDOW_S
from models.registry import Registry, hash_secret
from pipelines import artifacts
from pipelines.eventlog import EventLog, Message, Record, TopicSpec
from pipelines.eventlog.base import Tail

PLATFORM = "_platform"  # tenant id under which platform-wide admin events are keyed


class AdminError(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param  # the input it is about, where it is one


class AdminNotFound(AdminError):
    pass


class AdminConflict(AdminError):
    pass


class AdminForbidden(AdminError):
    """Asked of a tenant admin beyond what its operator granted."""


class RegistryView:
    """A `Registry` kept up to date by following the admin topic from where it left off.

    It follows through a tail of its own (on Kafka, a consumer assigned to the admin
    partition only), so asking whether anything changed, which every request does, is one
    cheap end-offset query and never moves a reader shared with other work. Callers that
    ask while a query is under way share the next one: a query that began after a caller
    asked sees everything written before it asked."""

    CATCH_UP_S = 30.0  # the most a refresh waits for records it knows are there
    LOCK_WAIT_S = 10.0  # the most a refresh waits for the look under way (a log that does not answer)

    def __init__(self, log: EventLog):
        self._log = log
        self._next = 0
        self._lock = threading.Lock()
        self._tail: Tail | None = None
        self._current_since = float("-inf")  # when the last completed query began (monotonic)
        self._failed_at = float("-inf")  # when the last query failed (monotonic)
        self._failure: BaseException | None = None
        self.registry = Registry()
        self.checks = 0  # times it asked the log for the admin topic's end

    def refresh(self, timeout_s: float = 0.0) -> Registry:
        """Applies every admin event written before the call; with `timeout_s`, first waits
        up to that long for a new one if there is none. While the log does not answer, callers
        do not queue for a look each: one that waited for a look that failed fails with it
        (TimeoutError), as does one that waits longer than `LOCK_WAIT_S` for its turn."""
        asked = time.monotonic()
        if not self._lock.acquire(timeout=self.LOCK_WAIT_S):
            raise TimeoutError(f"admin topic: a look under way for over {self.LOCK_WAIT_S} s")
        try:
            if not timeout_s and self._current_since > asked:
                return self.registry  # a query that began after this call covered it
            if self._failed_at > asked:  # it waited for a look that failed meanwhile
                raise TimeoutError(f"admin topic: the look under way failed ({self._failure!r})")
            began = time.monotonic()
            try:
                registry = self._catch_up(timeout_s)
            except Exception as exc:
                self._failed_at, self._failure = time.monotonic(), exc
                raise
            self._current_since = began
            return registry
        finally:
            self._lock.release()

    def _catch_up(self, timeout_s: float) -> Registry:
        if self._tail is None:
            self._tail = self._log.tail(topics.ADMIN.name, {0: self._next})
        self.checks += 1
        end = self._tail.end_offsets()[0]
        if end <= self._next:
            if not timeout_s or not self._apply(self._tail.poll(max_records=1000, timeout_s=timeout_s)):
                return self.registry
            end = self._tail.end_offsets()[0]
        try:
            self._apply(self._tail.read_to({0: end}, timeout_s=self.CATCH_UP_S))
        except TimeoutError:
            raise TimeoutError(f"admin topic: at offset {self._next} of {end} after {self.CATCH_UP_S} s") from None
        return self.registry

    def _apply(self, records: Iterable[Record]) -> int:
        applied = 0
        try:
            for record in records:
                self.registry.apply(decode(record.value))
                applied += 1
        finally:
            self._next = max(self._next, self._tail.offsets[0])
        return applied

    def close(self) -> None:
        with self._lock:
            if self._tail is not None:
                self._tail.close()
                self._tail = None


def _append(log: EventLog, env: Envelope) -> None:
    log.append(topics.ADMIN.name, [Message(key=env.tenant_id, value=encode(env), partition=0)])


def _admin_event(payload, tenant_id: str) -> Envelope:
    return new_event(payload, tenant_id=tenant_id, correlation_id=str(uuid.uuid4()))


def create_tenant(view: RegistryView, *, tenant_id: str, name: str, actor: str) -> Envelope:
    if tenant_id in view.refresh().tenants:
        raise AdminConflict(f"tenant {tenant_id!r} already exists")
    try:
        payload = TenantCreated(tenant_id=tenant_id, name=name, actor=actor)
    except ValidationError:
        raise AdminError("a tenant id is 1-63 lowercase letters, digits, '-' or '_', starting with a letter "
                         "or digit") from None
    env = _admin_event(payload, tenant_id)
    _append(view._log, env)
    return env


def issue_key(
    view: RegistryView, *, tenant_id: str, actor: str, application_id: str = "default",
    scopes: tuple[str, ...] = ("generate", "batch", "usage"), expires_at=None, rotated_from: str | None = None,
) -> tuple[str, Envelope]:
    """Returns the secret (shown once) and the event, which stores only its hash. The key
    stops authenticating at `expires_at` (a timezone-aware datetime), if given."""
    if tenant_id not in view.refresh().tenants:
        raise AdminNotFound(f"tenant {tenant_id!r} does not exist")
    unknown = set(scopes) - set(ALL_SCOPES)
    if unknown:
        raise AdminError(f"unknown scopes: {sorted(unknown)}")
    key_id = "key_" + secrets.token_hex(6)
    secret = f"llm-{key_id[4:]}-{secrets.token_urlsafe(24)}"
    env = _admin_event(
        ApiKeyIssued(key_id=key_id, tenant_id=tenant_id, application_id=application_id,
                     secret_sha256=hash_secret(secret), scopes=tuple(scopes), actor=actor, expires_at=expires_at,
                     rotated_from=rotated_from),
        tenant_id,
    )
    _append(view._log, env)
    return secret, env


def revoke_key(view: RegistryView, *, key_id: str, actor: str) -> Envelope:
    registry = view.refresh()
    owner = next((p.tenant_id for p in registry.keys_by_hash.values() if p.key_id == key_id), None)
    if owner is None:
        raise AdminNotFound(f"key {key_id!r} does not exist")
    env = _admin_event(ApiKeyRevoked(key_id=key_id, tenant_id=owner, actor=actor), owner)
    _append(view._log, env)
    return env


def approve_model(
    view: RegistryView, *, alias: str, model_revision: str, model_path: str, engine_config_hash: str,
    max_model_len: int, actor: str, price_input_per_1k_micros: int = 0, price_output_per_1k_micros: int = 0,
    allowed_tenants: tuple[str, ...] = ("*",), artifact_digests: dict[str, str] | None = None,
    artifact_signature: str | None = None, trusted: Iterable = (), require_signed: bool = False,
    engine_settings: engines.EngineSettings | dict | None = None, device: engines.Device | None = None,
) -> list[Envelope]:
    """Approves a revision (once: a later call with the same name only moves the alias) and
    points the alias at it. `artifact_digests` are the directory's file digests
    (`pipelines.artifacts.artifact_digests`); a signature over them must verify with one of
    the `trusted` keys, and with `require_signed` one must. `engine_settings`: the engine
    settings given (a dict, checked for `device`, this host's by default) or already
    resolved; they are recorded on the revision (`models.engine_settings`)."""
    registry = view.refresh()
    if model_revision in registry.retired:
        raise AdminConflict(f"model revision {model_revision!r} is retired; approve the model under a new revision")
    settings = resolve_engine_settings(engine_settings, device)
    signer = _artifact_signer(artifact_digests, artifact_signature, list(trusted), require_signed)
    events = []
    known = registry.revisions.get(model_revision)
    if known is not None and artifact_digests is not None and known.artifact_digests not in (None, artifact_digests):
        raise AdminConflict(f"model revision {model_revision!r} was approved with other files "
                            f"({'; '.join(artifacts.differences(known.artifact_digests, artifact_digests)[:3])}): "
                            f"approve these under a new revision")
    if known is not None and known.engine_settings not in (None, settings):
        raise AdminConflict(f"model revision {model_revision!r} was approved with other engine settings "
                            f"({known.engine_settings.model_dump(exclude_none=True)}): approve these under a new revision")
    if known is None:
        events.append(_admin_event(ModelRevisionApproved(
            model_revision=model_revision, model_path=model_path, engine_config_hash=engine_config_hash,
            max_model_len=max_model_len, price_input_per_1k_micros=price_input_per_1k_micros,
            price_output_per_1k_micros=price_output_per_1k_micros, actor=actor, artifact_digests=artifact_digests,
            artifact_signature=artifact_signature if signer else None, artifact_signer=signer,
            engine_settings=settings), PLATFORM))
    current = registry.aliases.get(alias)
    if current is None or current.model_revision != model_revision or current.allowed_tenants != frozenset(allowed_tenants):
        if alias in registry.open_rollouts:
            raise AdminConflict(f"alias {alias!r} has a rollout under way ({registry.open_rollouts[alias].rollout_id}): "
                                f"approve the revision under another alias, or end the rollout first")
        events.append(_admin_event(ModelAliasSet(
            alias=alias, model_revision=model_revision, allowed_tenants=allowed_tenants, actor=actor), PLATFORM))
    for env in events:
        _append(view._log, env)
    return events


def resolve_engine_settings(given: engines.EngineSettings | dict | None,
                            device: engines.Device | None = None) -> engines.EngineSettings:
    """The engine settings to record: `given` as they are when resolved already, else checked
    for `device` (this host's by default), with its defaults for what was not given."""
    if isinstance(given, engines.EngineSettings):
        return given
    try:
        return engines.resolve(given or {}, device or engines.detect_device())
    except engines.EngineSettingsError as exc:
        raise AdminError(str(exc), param=exc.field) from None


def _artifact_signer(digests: dict[str, str] | None, signature: str | None, trusted: list,
                     require_signed: bool) -> str | None:
    """The id of the trusted key that signed these digests; None when unsigned (allowed
    unless `require_signed`). A signature that does not verify is refused, never dropped."""
    if signature is not None and digests is None:
        raise AdminError("an artifact signature signs the artifact digests: give them too")
    if signature is None:
        if require_signed:
            raise AdminError("this platform approves signed artifacts only: give artifact digests and a signature "
                             "from a trusted key (ledgerlm model sign DIR)")
        return None
    if not trusted:
        raise AdminError("an artifact signature was given, but no key is trusted (LEDGERLM_ARTIFACT_TRUSTED_KEYS)")
    signer = artifacts.signer_of(artifacts.manifest_digest(digests), signature, trusted)
    if signer is None:
        raise AdminError("the artifact signature does not verify with any trusted key")
    return signer


def set_limits(view: RegistryView, *, tenant_id: str, actor: str, **changes) -> Envelope:
    """Changes some of a tenant's limits (a value of None lifts that limit, or restores the
    default of `fair_share_weight` (1.0) and `may_send_high` (not entitled)); the event
    carries the complete limits in force afterwards. A dedicated pool's work topics are
    created here, before any work can be routed to them."""
    registry = view.refresh()
    if tenant_id not in registry.tenants:
        raise AdminNotFound(f"tenant {tenant_id!r} does not exist")
    unknown = set(changes) - set(LIMIT_FIELDS)
    if unknown:
        raise AdminError(f"unknown limits: {sorted(unknown)}")
    window = changes.get("window_seconds")
    if window is not None and not 0 < window <= MAX_WINDOW_S:
        raise AdminError(f"window_seconds must be between 1 and {MAX_WINDOW_S}")
    if changes.get("pool") == topics.SHARED_POOL:
        changes["pool"] = None  # naming the shared pool means no dedicated one
    limits = {**registry.grant_for(tenant_id).as_dict(), **changes}
    try:
        payload = TenantLimitsChanged(tenant_id=tenant_id, actor=actor, **limits)
    except ValidationError as exc:
        raise AdminError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                   for e in exc.errors(include_url=False))) from None
    if payload.pool is not None:
        view._log.ensure_topics([TopicSpec(t.name, t.partitions, t.retention_ms)
                                 for t in topics.pool_work_topics(payload.pool)])
    env = _admin_event(payload, tenant_id)
    _append(view._log, env)
    return env


def set_alias(view: RegistryView, *, alias: str, model_revision: str, actor: str,
              allowed_tenants: tuple[str, ...] = ("*",)) -> Envelope:
    """Points an alias at an approved revision, for every tenant ('*') or the ones named."""
    registry = view.refresh()
    if alias in registry.open_rollouts:
        raise AdminConflict(f"alias {alias!r} has a rollout under way ({registry.open_rollouts[alias].rollout_id}): "
                            f"promote it or roll it back first")
    if model_revision not in registry.revisions:
        raise AdminNotFound(f"model revision {model_revision!r} is not approved")
    if model_revision in registry.retired:
        raise AdminConflict(f"model revision {model_revision!r} is retired")
    unknown = set(allowed_tenants) - set(registry.tenants) - {"*"}
    if unknown:
        raise AdminNotFound(f"unknown tenants: {sorted(unknown)}")
    env = _admin_event(ModelAliasSet(alias=alias, model_revision=model_revision,
                                     allowed_tenants=tuple(allowed_tenants), actor=actor), PLATFORM)
    _append(view._log, env)
    return env


def retire_revision(view: RegistryView, *, model_revision: str, actor: str, reason: str | None = None) -> Envelope:
    """Stops new work on a revision: aliases pointing at it resolve to nothing until
    re-pointed, and requests already pinned to it are rejected at admission; generations
    running on it finish. Final: a retired revision is never approved again, since its
    name stands for one model and engine in usage and audit (approve a new revision)."""
    registry = view.refresh()
    if model_revision not in registry.revisions:
        raise AdminNotFound(f"model revision {model_revision!r} is not approved")
    if model_revision in registry.retired:
        raise AdminConflict(f"model revision {model_revision!r} is already retired")
    env = _admin_event(ModelRevisionRetired(model_revision=model_revision, actor=actor, reason=reason), PLATFORM)
    _append(view._log, env)
    return env


def delete_alias(view: RegistryView, *, alias: str, actor: str) -> Envelope:
    """Removes an alias for every tenant; requests for it are then unknown models (404)."""
    if alias not in view.refresh().aliases:
        raise AdminNotFound(f"alias {alias!r} does not exist")
    env = _admin_event(ModelAliasDeleted(alias=alias, actor=actor), PLATFORM)
    _append(view._log, env)
    return env


def revisions_listed(registry: Registry) -> list[dict]:
    """Every approved revision, in the order approved, as `GET /v1/admin/models` and
    `ledgerlm admin model list` show it: the aliases pointing at it (with the tenants each
    allows), its model, engine config hash and settings (None: approved before revisions
    had them), context length and prices, whether it is retired
    (and why), and what its record says of its files."""
    listed = []
    for name, revision in registry.revisions.items():
        aliases = [{"alias": a.alias, "allowed_tenants": sorted(a.allowed_tenants)}
                   for a in sorted(registry.aliases.values(), key=lambda a: a.alias) if a.model_revision == name]
        listed.append({"model_revision": name, "aliases": aliases,
                       "model_path": revision.model_path, "engine_config_hash": revision.engine_config_hash,
                       "max_model_len": revision.max_model_len,
                       "price_input_per_1k_micros": revision.price_input_per_1k_micros,
                       "price_output_per_1k_micros": revision.price_output_per_1k_micros,
                       "engine_settings": revision.engine_settings and revision.engine_settings.model_dump(),
                       "retired": name in registry.retired, "retired_reason": registry.retired.get(name),
                       **artifacts.describe(revision)})
    return listed
