"""The console's keys page and its actions: issue, rotate, expire, revoke.

Each action is a plain form (with the session's CSRF token) that calls the same commands
as the `/v1/admin` routes (`pipelines.admin.commands`, `pipelines.admin.tenants`) under the same
rules (`api.routes.admin.owned_key`), so every change is an admin event on the log,
recorded with the signed-in user as its actor. A new key's secret is shown once, on the
page the action returns to, and kept nowhere else.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse

from api.console.auth import ConsoleRefusal, UserDep, action_form
from api.console.render import page
from api.errors import ApiError
from api.routes.admin import owned_key, run
from api.routes.admin_keys import MAX_OVERLAP_S
from models.authz import TENANT_GRANTABLE_SCOPES, ungrantable_scopes
from pipelines.admin import commands as admin
from pipelines.admin import tenants as admin_tenants

router = APIRouter(prefix="/console", include_in_schema=False)
ALL_SCOPES = ("generate", "batch", "usage", "audit", "tenant_admin", "operator")


def key_rows(registry, tenant_id: str, now: datetime) -> list[dict]:
    rows = []
    for p in registry.keys_of(tenant_id):
        expires = registry.expires.get(p.key_id)
        state = ("revoked" if p.key_id in registry.revoked else
                 "expired" if expires is not None and expires <= now else "active")
        rows.append({"key_id": p.key_id, "application_id": p.application_id, "scopes": sorted(p.scopes),
                     "expires_at": expires, "state": state})
    return rows


@router.get("/keys")
def keys(request: Request, user: UserDep, tenant: str | None = None):
    tenant_id = user.tenant(tenant)
    if tenant_id is None:
        return page(request, "pick_tenant.html", user=user, title="Keys", target="/console/keys")
    scopes = ALL_SCOPES if user.operator else tuple(s for s in ALL_SCOPES if s in TENANT_GRANTABLE_SCOPES)
    return page(request, "keys.html", user=user, tenant_id=tenant_id, scopes=scopes,
                rows=key_rows(user.registry, tenant_id, datetime.now(timezone.utc)), max_overlap_s=MAX_OVERLAP_S)


def _back(tenant_id: str) -> RedirectResponse:
    return RedirectResponse(f"/console/keys?tenant={tenant_id}", status_code=303)


def _refused(exc: ApiError) -> ConsoleRefusal:
    return ConsoleRefusal(exc.status, exc.message)


def _expiry(text: str | None) -> datetime | None:
    """A form's date and time (the browser's datetime-local, taken as UTC), or None."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ConsoleRefusal(400, "Not a date and time: " + text[:40]) from None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


@router.post("/keys/issue")
async def issue(request: Request, user: UserDep):
    form = await action_form(request, user)
    tenant_id = user.tenant(form.get("tenant"))
    if tenant_id is None:
        raise ConsoleRefusal(400, "Pick a tenant")
    scopes = tuple(s for s in ALL_SCOPES if form.get(f"scope_{s}") == "on")
    if not scopes:
        raise ConsoleRefusal(400, "A key needs at least one scope")
    if not user.operator and ungrantable_scopes(scopes):
        raise ConsoleRefusal(403, f"A tenant admin may not issue the scopes {sorted(ungrantable_scopes(scopes))}")
    application = (form.get("application_id") or "default").strip()
    if not 1 <= len(application) <= 128:
        raise ConsoleRefusal(400, "An application id is 1 to 128 characters")
    try:
        secret, env = run(admin.issue_key, view=request.app.state.services.registry_view, tenant_id=tenant_id,
                          actor=str(user.actor), application_id=application, scopes=scopes,
                          expires_at=_expiry(form.get("expires_at")))
    except ApiError as exc:
        raise _refused(exc) from None
    user.session.notices.append({"kind": "secret", "key_id": env.payload.key_id, "secret": secret,
                                 "text": f"Key {env.payload.key_id} issued. Copy its secret now: it is not shown again."})
    return _back(tenant_id)


async def _owned(request: Request, user, key_id: str) -> tuple[dict, str]:
    form = await action_form(request, user)
    try:
        return form, owned_key(user.actor, request.app.state.services, key_id)
    except ApiError as exc:
        raise _refused(exc) from None


@router.post("/keys/{key_id}/revoke")
async def revoke(request: Request, user: UserDep, key_id: str):
    _, tenant_id = await _owned(request, user, key_id)
    try:
        run(admin.revoke_key, view=request.app.state.services.registry_view, key_id=key_id, actor=str(user.actor))
    except ApiError as exc:
        raise _refused(exc) from None
    user.session.notices.append({"kind": "info", "text": f"Key {key_id} revoked."})
    return _back(tenant_id)


@router.post("/keys/{key_id}/rotate")
async def rotate(request: Request, user: UserDep, key_id: str):
    form, tenant_id = await _owned(request, user, key_id)
    try:
        overlap = int(form.get("old_key_valid_for_s") or 3600)
    except ValueError:
        raise ConsoleRefusal(400, "The overlap is a whole number of seconds") from None
    if not 0 <= overlap <= MAX_OVERLAP_S:
        raise ConsoleRefusal(400, f"The overlap is 0 to {MAX_OVERLAP_S} seconds")
    try:
        secret, events = run(admin_tenants.rotate_key, view=request.app.state.services.registry_view, key_id=key_id,
                             actor=str(user.actor), old_valid_until=datetime.now(timezone.utc) + timedelta(seconds=overlap),
                             expires_at=None)
    except ApiError as exc:
        raise _refused(exc) from None
    new_id = events[0].payload.key_id
    user.session.notices.append({"kind": "secret", "key_id": new_id, "secret": secret,
                                 "text": f"Key {key_id} rotated to {new_id}; the old key stays valid for {overlap} s. "
                                         "Copy the new secret now: it is not shown again."})
    return _back(tenant_id)


@router.post("/keys/{key_id}/expire")
async def expire(request: Request, user: UserDep, key_id: str):
    form, tenant_id = await _owned(request, user, key_id)
    at = _expiry(form.get("expires_at")) or datetime.now(timezone.utc)
    try:
        run(admin_tenants.set_key_expiry, view=request.app.state.services.registry_view, key_id=key_id,
            expires_at=at, actor=str(user.actor))
    except ApiError as exc:
        raise _refused(exc) from None
    user.session.notices.append({"kind": "info", "text": f"Key {key_id} expires at {at.isoformat()}."})
    return _back(tenant_id)
