"""`/v1/admin/...`: key expiry and rotation (a tenant admin on its own keys, an operator on
any), and tenant suspension (operators only). Each is an admin event (`pipelines.admin.tenants`)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from fastapi import APIRouter
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from api.admin_access import OperatorDep, TenantAdminDep
from api.deps import ServicesDep
from api.routes.admin import owned_key, run, tenant_json
from pipelines.admin import tenants as admin_tenants

router = APIRouter(prefix="/v1/admin")
MAX_OVERLAP_S = 90 * 24 * 3600  # how long a rotated key may stay live beside its successor


class RotateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # How long the old key stays valid beside the new one (0: it stops at once).
    old_key_valid_for_s: int = Field(default=3600, ge=0, le=MAX_OVERLAP_S)
    expires_at: AwareDatetime | None = None  # the new key's own expiry, if any


class ExpiryBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    expires_at: AwareDatetime


class SuspendBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=500)


@router.post("/keys/{key_id}/rotate", status_code=201)
def rotate_key(key_id: str, actor: TenantAdminDep, svc: ServicesDep, body: RotateBody | None = None):
    """A new key like the old one; the old one stays valid for `old_key_valid_for_s`."""
    body = body or RotateBody()
    owned_key(actor, svc, key_id)
    until = datetime.now(timezone.utc) + timedelta(seconds=body.old_key_valid_for_s)
    secret, events = run(admin_tenants.rotate_key, view=svc.registry_view, key_id=key_id, actor=str(actor),
                         old_valid_until=until, expires_at=body.expires_at)
    new = events[0].payload
    old_expires = svc.registry_view.refresh().expires.get(key_id)
    return {"key_id": new.key_id, "api_key": secret, "tenant_id": new.tenant_id, "application_id": new.application_id,
            "scopes": list(new.scopes), "expires_at": new.expires_at,
            "rotated_from": {"key_id": key_id, "expires_at": old_expires}}


@router.post("/keys/{key_id}/expiry")
def set_key_expiry(key_id: str, body: ExpiryBody, actor: TenantAdminDep, svc: ServicesDep):
    owned_key(actor, svc, key_id)
    env = run(admin_tenants.set_key_expiry, view=svc.registry_view, key_id=key_id, expires_at=body.expires_at,
              actor=str(actor))
    return {"key_id": key_id, "tenant_id": env.payload.tenant_id, "expires_at": env.payload.expires_at}


@router.post("/tenants/{tenant_id}/suspend")
def suspend_tenant(tenant_id: str, actor: OperatorDep, svc: ServicesDep, body: SuspendBody | None = None):
    """Its keys are refused (403 `tenant_suspended`) at once; its running work is cancelled."""
    run(admin_tenants.suspend_tenant, view=svc.registry_view, tenant_id=tenant_id, actor=str(actor),
        reason=body.reason if body else None)
    return tenant_json(svc.registry_view.refresh(), tenant_id)


@router.post("/tenants/{tenant_id}/reinstate")
def reinstate_tenant(tenant_id: str, actor: OperatorDep, svc: ServicesDep):
    run(admin_tenants.reinstate_tenant, view=svc.registry_view, tenant_id=tenant_id, actor=str(actor))
    return tenant_json(svc.registry_view.refresh(), tenant_id)
