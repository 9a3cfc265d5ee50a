"""`/v1/admin/tenants/{tenant_id}/cache`: a tenant's semantic cache, per alias (off until
a policy turns it on), its invalidation, and what this API's cache has done for it. An
operator for any tenant; a tenant admin for its own, except the price."""
from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.admin_access import TenantAdminDep
from api.deps import ServicesDep
from api.routes.admin import run
from pipelines.cache import admin as cache_admin

router = APIRouter(prefix="/v1/admin")


class PolicyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    threshold: float | None = Field(default=None, ge=0, le=1)
    ttl_s: int | None = Field(default=None, gt=0, le=30 * 24 * 3600)
    sampled_too: bool | None = None
    price_output_per_1k_micros: int | None = Field(default=None, ge=0)


class InvalidateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_alias: str | None = Field(default=None, min_length=1, max_length=128)
    reason: str | None = Field(default=None, max_length=500)


@router.put("/tenants/{tenant_id}/cache/{alias}")
def set_policy(tenant_id: str, alias: str, body: PolicyBody, actor: TenantAdminDep, svc: ServicesDep):
    env = run(cache_admin.set_policy, view=svc.registry_view, tenant_id=actor.tenant(tenant_id), alias=alias,
              actor=str(actor), operator=actor.operator, floor=svc.cache.floor, **body.model_dump())
    return {**env.payload.model_dump(exclude={"actor"}), "event_id": str(env.event_id)}


@router.post("/tenants/{tenant_id}/cache/invalidate")
def invalidate(tenant_id: str, body: InvalidateBody, actor: TenantAdminDep, svc: ServicesDep):
    env = run(cache_admin.invalidate, view=svc.registry_view, tenant_id=actor.tenant(tenant_id),
              alias=body.model_alias, actor=str(actor), reason=body.reason)
    svc.cache.purge(tenant_id, body.model_alias)  # the epoch kills them everywhere; here they go at once
    return {"tenant_id": tenant_id, "model_alias": body.model_alias, "event_id": str(env.event_id)}


@router.get("/tenants/{tenant_id}/cache")
def show(tenant_id: str, actor: TenantAdminDep, svc: ServicesDep):
    registry = svc.registry_view.refresh()
    run(cache_admin.check, registry=registry, tenant_id=actor.tenant(tenant_id), alias=None)
    rows = cache_admin.policies(registry, tenant_id)
    for row in rows:
        counts = svc.cache.counts.get((tenant_id, row["model_alias"]))
        row["this_api"] = {"hits": counts.hits if counts else 0, "misses": counts.misses if counts else 0}
    return {"data": rows, "entries_this_api": svc.cache.size(tenant_id)}
