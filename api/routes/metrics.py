"""`GET /metrics`: this API process's Prometheus metrics (see `api.metrics`).

Open by default, as scrapers expect; `LEDGERLM_METRICS_ACCESS=key` or `off` puts it behind
a key or turns it off (`api.ops_access`). It names tenants (per-tenant series) but carries
no text, ids or keys.
"""
from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from api.deps import ServicesDep
from api.ops_access import metrics_access

router = APIRouter()


@router.get("/metrics", include_in_schema=False, dependencies=[Depends(metrics_access)])
async def metrics(svc: ServicesDep) -> Response:
    body, content_type = svc.metrics.render()
    return Response(body, media_type=content_type)
