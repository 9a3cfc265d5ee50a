"""`GET /metrics`: this API process's Prometheus metrics (see `api.metrics`).

Unauthenticated, as scrapers expect: put it behind the network, not the internet. It
names tenants (per-tenant series) but carries no text, ids or keys.
"""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from api.deps import ServicesDep

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics(svc: ServicesDep) -> Response:
    body, content_type = svc.metrics.render()
    return Response(body, media_type=content_type)
