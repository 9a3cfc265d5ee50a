"""`GET /v1/audit/events`: the audit trail, a page at a time, in time order.

Who sees what: a key with the `audit` scope sees its own tenant's events; a key with
both `audit` and `operator` (or `admin`) is a platform auditor and sees every tenant's (and the
platform's own), optionally narrowed with `tenant`. Each item is the event exactly as
chained (the record's canonical JSON) with its position, hash and chain link, so an
auditor can check `sha256(event) == event_hash` on their own. Only durable topics are
chained, and they carry no prompt or completion text.
"""
from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import scope
from api.errors import ApiError
from api.query_types import IsoDateTime
from api.deps import ProjectionDbDep
from models.authz import is_operator
from models.registry import Principal
from pipelines.projections.queries import audit_events

router = APIRouter()
AuditDep = Annotated[Principal, scope("audit")]


def is_platform_auditor(principal: Principal) -> bool:
    return "audit" in principal.scopes and is_operator(principal.scopes)


def encode_cursor(cursor) -> str:
    at, topic, partition, offset = cursor
    return base64.urlsafe_b64encode(json.dumps([at.isoformat(), topic, partition, offset]).encode()).decode()


def decode_cursor(text: str):
    try:
        at, topic, partition, offset = json.loads(base64.urlsafe_b64decode(text.encode()))
        return datetime.fromisoformat(at), str(topic), int(partition), int(offset)
    except (ValueError, TypeError):
        raise ApiError(400, "after: not a cursor this API returned", code="invalid_value", param="after") from None


@router.get("/v1/audit/events")
def list_audit_events(
    principal: AuditDep, db: ProjectionDbDep,
    since: IsoDateTime | None = None, until: IsoDateTime | None = None,
    type: Annotated[list[str] | None, Query(description="event types; repeat or comma-separate")] = None,
    tenant: str | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100, after: str | None = None,
):
    if is_platform_auditor(principal):
        tenant_id = tenant
    elif tenant is not None and tenant != principal.tenant_id:
        raise ApiError(403, "Only a platform auditor (scopes audit and operator) may read other tenants' events",
                       code="insufficient_scope", param="tenant")
    else:
        tenant_id = principal.tenant_id
    types = [t for value in type or () for t in value.split(",") if t] or None
    page, cursor = audit_events(db, tenant_id=tenant_id, since=since, until=until, types=types, limit=limit,
                                after=decode_cursor(after) if after else None)
    data = [{**item, "event": json.loads(item["event"]) if item["event"] else None} for item in page]
    return {"object": "list", "data": data, "has_more": cursor is not None,
            "next_cursor": encode_cursor(cursor) if cursor else None}
