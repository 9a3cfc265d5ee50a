"""`GET /v1/models`: the aliases this tenant may use, each with the revision it pins and
what the fleet serves of it now (live workers and their free slots, over every pool).
An alias the tenant may not use is indistinguishable from one that does not exist."""
from __future__ import annotations

from fastapi import APIRouter

from api.deps import PrincipalDep, ServicesDep
from api.errors import ApiError

router = APIRouter()


def model_json(alias, revision, fleet) -> dict:
    serving = [c for (_, rev), c in fleet.capacity().items() if rev == alias.model_revision]
    return {"id": alias.alias, "object": "model", "created": 0, "owned_by": "ledgerlm",
            "model_revision": alias.model_revision,
            "max_model_len": revision.max_model_len if revision else None,
            "serving": {"workers": sum(c.workers for c in serving),
                        "free_slots": sum(c.free_slots for c in serving)}}


@router.get("/v1/models")
def list_models(principal: PrincipalDep, svc: ServicesDep):
    registry = svc.registry_view.refresh()
    data = [model_json(a, registry.revisions.get(a.model_revision), svc.fleet)
            for a in registry.aliases_for(principal.tenant_id) if a.model_revision in registry.revisions]
    return {"object": "list", "data": data}


@router.get("/v1/models/{alias}")
def get_model(alias: str, principal: PrincipalDep, svc: ServicesDep):
    registry = svc.registry_view.refresh()
    revision = registry.resolve_alias(alias, principal.tenant_id)
    if revision is None:
        raise ApiError(404, f"The model '{alias}' does not exist", code="model_not_found", param="model")
    return model_json(registry.aliases[alias], revision, svc.fleet)
