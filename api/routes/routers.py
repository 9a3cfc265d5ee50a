"""`/v1/admin/routers/{alias}`: a router alias's rules and fallbacks (operators only), and
the overload ladder's state in this API (revisions cooling down, fallbacks taken)."""
from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.admin_access import OperatorDep
from api.deps import ServicesDep
from api.routes.admin import run
from pipelines.admin import routers as router_admin

router = APIRouter(prefix="/v1/admin")


class RouterBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rules: list[dict] = Field(default_factory=list, max_length=100)
    fallbacks: list[str] = Field(default_factory=list, max_length=8)


@router.put("/routers/{alias}")
def set_router(alias: str, body: RouterBody, actor: OperatorDep, svc: ServicesDep):
    run(router_admin.set_router, view=svc.registry_view, alias=alias, rules=body.rules, fallbacks=body.fallbacks,
        actor=str(actor))
    return show(alias, actor, svc)


@router.get("/routers/{alias}")
def show(alias: str, actor: OperatorDep, svc: ServicesDep):
    described = run(router_admin.describe, registry=svc.registry_view.refresh(), alias=alias)
    return {**described, "ladder": svc.ladder.state(alias)}


@router.delete("/routers/{alias}")
def clear(alias: str, actor: OperatorDep, svc: ServicesDep):
    env = run(router_admin.clear_router, view=svc.registry_view, alias=alias, actor=str(actor))
    return {"alias": alias, "cleared": True, "event_id": str(env.event_id)}
