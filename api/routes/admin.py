"""`/v1/admin/...`: tenants, keys, limits, model revisions and aliases.

Every change is an admin event on the log (`pipelines.admin.commands`); these routes only
translate HTTP into those commands. Platform routes (tenants made, models, aliases, the
fleet) take an operator (`OperatorDep`: scope `operator`, or its older name `admin`, or
the settings' `bootstrap_token`, to make the first one); a tenant's own routes (reading
it, its keys, its limits) also take its tenant admin (`TenantAdminDep`), to whom any
other tenant is missing (404). See `api.admin_access`.
"""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, create_model

from api.admin_access import Actor, OperatorDep, TenantAdminDep
from api.deps import ServicesDep
from api.errors import ApiError
from models.authz import ungrantable_scopes
from models.engine_settings import FIELDS as ENGINE_FIELDS
from models.events_admin import Scope
from models.limits import LIMITS, body_field
from pipelines import artifacts
from pipelines.admin import commands as admin
from pipelines.admin import tenants as admin_tenants

router = APIRouter(prefix="/v1/admin")
ActorDep = OperatorDep  # the name other admin routers import


def run(command, **kwargs):
    try:
        return command(**kwargs)
    except admin.AdminNotFound as exc:
        raise ApiError(404, str(exc), code="not_found") from None
    except admin.AdminConflict as exc:
        raise ApiError(409, str(exc), code="conflict") from None
    except admin.AdminForbidden as exc:
        raise ApiError(403, str(exc), code="beyond_grant") from None
    except admin.AdminError as exc:
        raise ApiError(400, str(exc), code="invalid_value", param=exc.param) from None


class TenantBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant_id: str = Field(min_length=1, max_length=63)
    name: str | None = Field(default=None, max_length=200)


class KeyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    application_id: str = Field(default="default", min_length=1, max_length=128)
    scopes: list[Scope] = Field(default_factory=lambda: ["generate", "batch", "usage"], min_length=1)
    expires_at: AwareDatetime | None = None


# Only the fields sent change; null lifts a limit, or restores its default (weight 1.0, no
# right to send priority `high`). A field per limit of the catalogue (`models.limits`).
LimitsBody = create_model("LimitsBody", __config__=ConfigDict(extra="forbid"), __module__=__name__,
                          __doc__="Only the fields sent change; null lifts a limit.",
                          **{spec.name: body_field(spec) for spec in LIMITS})


class ModelBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alias: str = Field(min_length=1, max_length=128)
    model_revision: str = Field(min_length=1, max_length=200)
    model_path: str = Field(min_length=1)
    engine_config_hash: str = Field(min_length=1, max_length=128)
    max_model_len: int = Field(gt=0)
    price_input_per_1k_micros: int = Field(default=0, ge=0)
    price_output_per_1k_micros: int = Field(default=0, ge=0)
    allowed_tenants: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    # the model directory's file digests (`ledgerlm model sign DIR` prints them), and a
    # signature over them by a trusted key; a worker then serves only those files
    artifact_digests: dict[Annotated[str, Field(min_length=1, max_length=500)],
                           Annotated[str, Field(pattern="^[0-9a-f]{64}$")]] | None = Field(
        default=None, min_length=1, max_length=10_000)
    artifact_signature: str | None = Field(default=None, pattern="^[0-9a-f]{128}$")
    # engine settings (`models.engine_settings`), checked at approval; unset: the device's defaults
    dtype: str | None = None
    quantization: str | None = None
    tensor_parallel_size: int | None = None
    enforce_eager: bool | None = None
    kv_cache_gb: float | None = None
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int | None = None


class AliasBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_revision: str = Field(min_length=1, max_length=200)
    allowed_tenants: list[str] = Field(default_factory=lambda: ["*"], min_length=1)


class RetireBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=500)


def tenant_json(registry, tenant_id: str) -> dict:
    tenant = registry.tenants.get(tenant_id)
    if tenant is None:
        raise ApiError(404, f"tenant {tenant_id!r} does not exist", code="not_found")
    # `limits`: in force; `granted`: the operator's, which the tenant's own only tighten.
    return {"tenant_id": tenant.tenant_id, "name": tenant.name, "limits": registry.limits_for(tenant_id).as_dict(),
            "granted": registry.grant_for(tenant_id).as_dict(), "suspended": tenant_id in registry.suspended}


def owned_key(actor: Actor, svc, key_id: str) -> str:
    """The key's tenant, if the actor manages it; any other key is missing (404). A tenant
    admin manages only keys it could have issued: never an operator's key of its tenant
    (rotating one would hand it an operator key)."""
    try:
        owner = admin_tenants.key_owner(svc.registry_view, key_id)
    except admin.AdminNotFound as exc:
        raise ApiError(404, str(exc), code="not_found") from None
    if not actor.may_manage(owner.tenant_id):
        raise ApiError(404, f"key {key_id!r} does not exist", code="not_found")
    if not actor.operator and ungrantable_scopes(owner.scopes):
        raise ApiError(403, "Only an operator manages a key with the scopes "
                       f"{sorted(ungrantable_scopes(owner.scopes))}", code="insufficient_scope")
    return owner.tenant_id


@router.post("/tenants", status_code=201)
def create_tenant(body: TenantBody, actor: OperatorDep, svc: ServicesDep):
    run(admin.create_tenant, view=svc.registry_view, tenant_id=body.tenant_id, name=body.name or body.tenant_id,
        actor=str(actor))
    return tenant_json(svc.registry_view.refresh(), body.tenant_id)


@router.get("/tenants")
def list_tenants(actor: TenantAdminDep, svc: ServicesDep):
    """Every tenant to an operator; a tenant admin's own only."""
    registry = svc.registry_view.refresh()
    return {"object": "list", "data": [tenant_json(registry, t) for t in sorted(registry.tenants)
                                       if actor.may_manage(t)]}


@router.get("/tenants/{tenant_id}")
def get_tenant(tenant_id: str, actor: TenantAdminDep, svc: ServicesDep):
    actor.tenant(tenant_id)
    registry = svc.registry_view.refresh()
    keys = [{"key_id": p.key_id, "application_id": p.application_id, "scopes": sorted(p.scopes),
             "revoked": p.key_id in registry.revoked, "expires_at": registry.expires.get(p.key_id)}
            for p in registry.keys_of(tenant_id)]
    return {**tenant_json(registry, tenant_id), "keys": keys}


@router.post("/tenants/{tenant_id}/keys", status_code=201)
def issue_key(tenant_id: str, body: KeyBody, actor: TenantAdminDep, svc: ServicesDep):
    actor.tenant(tenant_id)
    if not actor.operator and ungrantable_scopes(body.scopes):
        raise ApiError(403, f"A tenant admin may not issue the scopes {sorted(ungrantable_scopes(body.scopes))}",
                       code="insufficient_scope", param="scopes")
    secret, env = run(admin.issue_key, view=svc.registry_view, tenant_id=tenant_id, actor=str(actor),
                      application_id=body.application_id, scopes=tuple(body.scopes), expires_at=body.expires_at)
    # The secret is shown here once; the log keeps only its hash.
    return {"key_id": env.payload.key_id, "api_key": secret, "tenant_id": tenant_id,
            "application_id": body.application_id, "scopes": list(env.payload.scopes),
            "expires_at": body.expires_at}


@router.post("/keys/{key_id}/revoke")
def revoke_key(key_id: str, actor: TenantAdminDep, svc: ServicesDep):
    owned_key(actor, svc, key_id)
    env = run(admin.revoke_key, view=svc.registry_view, key_id=key_id, actor=str(actor))
    return {"key_id": key_id, "tenant_id": env.payload.tenant_id, "revoked": True}


@router.patch("/tenants/{tenant_id}/limits")
@router.put("/tenants/{tenant_id}/limits")
def set_limits(tenant_id: str, body: LimitsBody, actor: TenantAdminDep, svc: ServicesDep):
    """An operator sets the grant; a tenant admin its own limits, within the grant (403
    `beyond_grant` otherwise, and for the fields only an operator sets)."""
    actor.tenant(tenant_id)
    changes = body.model_dump(include=body.model_fields_set)
    command = admin.set_limits if actor.operator else admin_tenants.set_own_limits
    run(command, view=svc.registry_view, tenant_id=tenant_id, actor=str(actor), **changes)
    return tenant_json(svc.registry_view.refresh(), tenant_id)


@router.post("/models", status_code=201)
def approve_model(body: ModelBody, actor: OperatorDep, svc: ServicesDep):
    data = body.model_dump(exclude=set(ENGINE_FIELDS))
    run(admin.approve_model, view=svc.registry_view, actor=str(actor), **artifacts.approval_policy(svc.settings),
        **{**data, "allowed_tenants": tuple(body.allowed_tenants)},
        engine_settings=body.model_dump(include=set(ENGINE_FIELDS), exclude_none=True))
    revision = svc.registry_view.refresh().revisions[body.model_revision]
    return {"alias": body.alias, "model_revision": body.model_revision, "allowed_tenants": body.allowed_tenants,
            "engine_settings": revision.engine_settings and revision.engine_settings.model_dump(),
            **artifacts.describe(revision)}


@router.get("/models")
def list_models(actor: OperatorDep, svc: ServicesDep):
    """Every approved revision, in the order approved: the aliases pointing at it, its model,
    engine config hash and settings, context length, prices, and whether it is retired."""
    return {"object": "list", "data": admin.revisions_listed(svc.registry_view.refresh())}


@router.put("/aliases/{alias}")
def set_alias(alias: str, body: AliasBody, actor: OperatorDep, svc: ServicesDep):
    run(admin.set_alias, view=svc.registry_view, alias=alias, model_revision=body.model_revision, actor=str(actor),
        allowed_tenants=tuple(body.allowed_tenants))
    return {"alias": alias, "model_revision": body.model_revision, "allowed_tenants": body.allowed_tenants}


@router.post("/models/{model_revision:path}/retire")  # a revision name may hold a '/'; the route is unambiguous
def retire_revision(model_revision: str, actor: OperatorDep, svc: ServicesDep, body: RetireBody | None = None):
    """New work on the revision is refused (410 `model_retired`); running work finishes."""
    reason = body.reason if body else None
    run(admin.retire_revision, view=svc.registry_view, model_revision=model_revision, actor=str(actor), reason=reason)
    return {"model_revision": model_revision, "retired": True, "reason": reason}


@router.delete("/aliases/{alias}")
def delete_alias(alias: str, actor: OperatorDep, svc: ServicesDep):
    run(admin.delete_alias, view=svc.registry_view, alias=alias, actor=str(actor))
    return {"alias": alias, "deleted": True}
