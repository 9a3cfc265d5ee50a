"""Admin commands a tenant admin may run on its own tenant (an operator on any), and the
operator's suspension of a tenant. Each appends admin events (`models.events_admin`)."""
from __future__ import annotations

from datetime import datetime, timezone

from pydantic import ValidationError

from models.authz import OWN_LIMIT_FIELDS, beyond_grant
from models.events import Envelope
from models.events_admin import ApiKeyExpirySet, TenantOwnLimitsChanged, TenantReinstated, TenantSuspended
from models.registry import Principal
from pipelines.admin.commands import (
    AdminConflict, AdminError, AdminForbidden, AdminNotFound, RegistryView, _admin_event, _append, issue_key,
)


def key_owner(view: RegistryView, key_id: str) -> Principal:
    principal = next((p for p in view.refresh().keys_by_hash.values() if p.key_id == key_id), None)
    if principal is None:
        raise AdminNotFound(f"key {key_id!r} does not exist")
    return principal


def set_own_limits(view: RegistryView, *, tenant_id: str, actor: str, **changes) -> Envelope:
    """A tenant's own limits (only those sent change; None lifts one), each no looser than
    what the operator granted (`AdminForbidden` otherwise)."""
    registry = view.refresh()
    if tenant_id not in registry.tenants:
        raise AdminNotFound(f"tenant {tenant_id!r} does not exist")
    theirs = set(changes) - set(OWN_LIMIT_FIELDS)
    if theirs:
        raise AdminForbidden(f"only an operator sets {sorted(theirs)}")
    own = {**registry.own_limits.get(tenant_id, {}), **changes}
    beyond = beyond_grant(registry.grant_for(tenant_id), own)
    if beyond:
        raise AdminForbidden("beyond what the operator granted: " + ", ".join(
            f"{name} {asked} > {granted}" for name, (asked, granted) in sorted(beyond.items())))
    try:
        payload = TenantOwnLimitsChanged(tenant_id=tenant_id, actor=actor, **own)
    except ValidationError as exc:
        raise AdminError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                   for e in exc.errors(include_url=False))) from None
    env = _admin_event(payload, tenant_id)
    _append(view._log, env)
    return env


def _aware(when: datetime | None) -> datetime | None:
    if when is not None and when.tzinfo is None:
        raise AdminError("a time needs its timezone (e.g. 2027-01-01T00:00:00Z)")
    return when


def set_key_expiry(view: RegistryView, *, key_id: str, expires_at: datetime, actor: str) -> Envelope:
    owner = key_owner(view, key_id)
    if key_id in view.registry.revoked:
        raise AdminConflict(f"key {key_id!r} is revoked")
    env = _admin_event(ApiKeyExpirySet(key_id=key_id, tenant_id=owner.tenant_id, expires_at=_aware(expires_at),
                                       actor=actor), owner.tenant_id)
    _append(view._log, env)
    return env


def rotate_key(view: RegistryView, *, key_id: str, actor: str, old_valid_until: datetime | None = None,
               expires_at: datetime | None = None) -> tuple[str, list[Envelope]]:
    """A new key with the old one's tenant, application and scopes (`expires_at`: its own
    expiry, if any); the old one stays valid until `old_valid_until` (now if None), so both
    are live during the rotation. Returns the new secret (shown once) and the events."""
    owner = key_owner(view, key_id)
    registry = view.registry
    if key_id in registry.revoked:
        raise AdminConflict(f"key {key_id!r} is revoked")
    now = datetime.now(timezone.utc)
    until = _aware(old_valid_until) or now
    if _aware(expires_at) is not None and expires_at <= until:
        raise AdminError("the new key would expire before the old one")
    current = registry.expires.get(key_id)
    secret, issued = issue_key(view, tenant_id=owner.tenant_id, actor=actor, application_id=owner.application_id,
                               scopes=tuple(sorted(owner.scopes)), expires_at=expires_at, rotated_from=key_id)
    events = [issued]
    if current is None or until < current:  # a rotation never extends the old key's life
        events.append(set_key_expiry(view, key_id=key_id, expires_at=until, actor=actor))
    return secret, events


def suspend_tenant(view: RegistryView, *, tenant_id: str, actor: str, reason: str | None = None) -> Envelope:
    """Refuses the tenant's keys at once; admission cancels and settles its running work."""
    registry = view.refresh()
    if tenant_id not in registry.tenants:
        raise AdminNotFound(f"tenant {tenant_id!r} does not exist")
    if tenant_id in registry.suspended:
        raise AdminConflict(f"tenant {tenant_id!r} is already suspended")
    env = _admin_event(TenantSuspended(tenant_id=tenant_id, actor=actor, reason=reason), tenant_id)
    _append(view._log, env)
    return env


def reinstate_tenant(view: RegistryView, *, tenant_id: str, actor: str) -> Envelope:
    registry = view.refresh()
    if tenant_id not in registry.tenants:
        raise AdminNotFound(f"tenant {tenant_id!r} does not exist")
    if tenant_id not in registry.suspended:
        raise AdminConflict(f"tenant {tenant_id!r} is not suspended")
    env = _admin_event(TenantReinstated(tenant_id=tenant_id, actor=actor), tenant_id)
    _append(view._log, env)
    return env
