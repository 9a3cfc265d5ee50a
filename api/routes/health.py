"""Liveness and readiness, unauthenticated, as load balancers and orchestrators expect.

`GET /healthz` and `GET /health` (vLLM's and load tools' name): the process serves HTTP.
`GET /readyz`: it can do its work, i.e. the event log and the projection database answer,
each within `CHECK_S`, and its background readers of the log are not riding out an
outage (`pipelines.outage.Readiness`); 503 with what failed until then. It holds no tenant data.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import text

from api.deps import ServicesDep
from api.deps import projection_db
from models import topics

router = APIRouter()
logger = logging.getLogger(__name__)
CHECK_S = 2.0  # a dependency slower than this to answer is not ready


@router.get("/healthz")
@router.get("/health")
async def health() -> dict:
    return {"status": "ok"}


def _log_answers(svc) -> None:
    svc.log.end_offset(topics.REQUESTS.name, 0)


def _database_answers(request: Request) -> None:
    with projection_db(request).connect() as conn:
        conn.execute(text("SELECT 1"))


async def _check(name: str, check, *args) -> tuple[str, bool]:
    try:
        await asyncio.wait_for(asyncio.to_thread(check, *args), CHECK_S)
        return name, True
    except Exception as exc:  # noqa: BLE001 - any failure means not ready; the body says which
        logger.warning("readiness: %s is not reachable: %r", name, exc)
        return name, False


class Readiness(BaseModel):
    status: Literal["ready", "not_ready"]
    checks: dict[str, bool]


@router.get("/readyz", response_model=Readiness,
            responses={503: {"model": Readiness, "description": "The event log or the database does not answer"}})
async def ready(request: Request, svc: ServicesDep):
    checks = dict(await asyncio.gather(_check("event_log", _log_answers, svc),
                                       _check("database", _database_answers, request)))
    # The background readers (registry, fleet, streams) say whether they reach the log too.
    for component in getattr(request.app.state, "readiness", ()):
        checks[component.component] = component.serving
    ok = all(checks.values())
    return JSONResponse({"status": "ready" if ok else "not_ready", "checks": checks}, status_code=200 if ok else 503)
