"""`GET /v1/admin/fleet`: every worker the API's fleet view knows, its capacity, load and
last heartbeat, and a summary per (pool, revision). Admin scope (or the bootstrap token),
as every `/v1/admin` route: it names hosts and process ids.

It answers from `svc.fleet` as of its last refresh (the API refreshes it in the
background), judged against the clock now, so a silent worker shows as lost without a
read of the log.
"""
from __future__ import annotations

from fastapi import APIRouter

from api.deps import ServicesDep
from api.fleet_report import FleetOut, fleet_report
from api.routes.admin import ActorDep
from pipelines.fleet import wall_clock

router = APIRouter(prefix="/v1/admin")


@router.get("/fleet", response_model=FleetOut)
async def fleet(svc: ServicesDep, _: ActorDep, pool: str | None = None, model_revision: str | None = None) -> FleetOut:
    view = svc.fleet
    return fleet_report(view.all(), wall_clock(), view.lost_after_s, pool=pool, revision=model_revision)
