"""`GET /v1/usage` (the tenant's own settled usage, grouped) and `GET /v1/usage/quota`.

Both read the projections, so they trail the log by the projector's lag; the tenant is
the key's, and only the key's.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Literal

from fastapi import APIRouter

from api.deps import ProjectionDbDep, scope
from api.errors import ApiError
from api.query_types import IsoDate
from models.registry import Principal
from pipelines.projections.queries import tenant_quota, usage_summary

router = APIRouter()
UsageDep = Annotated[Principal, scope("usage")]
@router.get("/v1/usage")
def get_usage(principal: UsageDep, db: ProjectionDbDep, group_by: Literal["day", "model", "application"] = "day",
              start_date: IsoDate | None = None, end_date: IsoDate | None = None):
    if start_date and end_date and start_date > end_date:
        raise ApiError(400, "start_date is after end_date", code="invalid_value", param="start_date")
    data = usage_summary(db, principal.tenant_id, group_by=group_by, start=start_date, end=end_date)
    return {"object": "list", "group_by": group_by, "start_date": start_date, "end_date": end_date, "data": data}


@router.get("/v1/usage/quota")
def get_quota(principal: UsageDep, db: ProjectionDbDep):
    return tenant_quota(db, principal.tenant_id, datetime.now(timezone.utc))
