"""A generation's status for its tenant: from this process's request index (fresh, the
last day or so, read-your-writes) and otherwise from the generations projection (SQL,
everything, trailing the log by the projector's lag). Both say the same thing: the
index folds events with the projection's own `merge`.
"""
from __future__ import annotations

import logging
from typing import Any

from fastapi import Request
from sqlalchemy.exc import SQLAlchemyError

from api.deps import Services
from api.deps import projection_db
from pipelines.generation.idempotency import meant_ids
from pipelines.projections.queries import generation_status, status_from_row

logger = logging.getLogger(__name__)


def find_status(svc: Services, request: Request, tenant_id: str, request_id: str) -> dict[str, Any] | None:
    """By the generation's id, or by the request_id its client chose."""
    for candidate in meant_ids(tenant_id, request_id):
        row = svc.index.status(tenant_id, candidate)
        status = status_from_row(row) if row is not None else _from_projection(request, tenant_id, candidate)
        if status is not None:
            return {"id": candidate, "object": "generation", **status}
    return None


def _from_projection(request: Request, tenant_id: str, request_id: str) -> dict[str, Any] | None:
    try:
        return generation_status(projection_db(request), tenant_id, request_id)
    except SQLAlchemyError as exc:  # no projection database here (e.g. no projector deployed)
        logger.debug("generation status from the projection unavailable: %s", type(exc).__name__)
        return None
