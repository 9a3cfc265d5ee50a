"""`GET /v1/admin/fleet`: every worker the API's fleet view knows, its capacity, load and
last heartbeat, and a summary per (pool, revision). Admin scope (or the bootstrap token),
as every `/v1/admin` route: it names hosts and process ids.

It answers from `svc.fleet` as of its last refresh (the API refreshes it in the
background), judged against the clock now, so a silent worker shows as lost without a
read of the log. A worker is judged lost as admission judges it: silent for the
settings' `worker_lost_after_s` (never less than three of its own heartbeat intervals),
which the answer's `lost_after_s` says.
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
    return fleet_report(svc.fleet.all(), wall_clock(), svc.settings.worker_lost_after_s, pool=pool,
                        revision=model_revision)
