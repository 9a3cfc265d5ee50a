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
    """By the generation's id, or by the request_id its client chose. `request_id` echoes
    the one its client chose where known (found by it, or recent enough for the request
    index), and is the generation's id otherwise."""
    for candidate, chosen in zip(meant_ids(tenant_id, request_id), (None, request_id)):
        row = svc.index.status(tenant_id, candidate)
        status = status_from_row(row) if row is not None else _from_projection(request, tenant_id, candidate)
        if status is not None:
            if chosen is None and row is not None:
                chosen = _chosen_of(svc, tenant_id, candidate)
            return {"id": candidate, "object": "generation", **status, **({"request_id": chosen} if chosen else {})}
    return None


def _chosen_of(svc: Services, tenant_id: str, request_id: str) -> str | None:
    info = svc.index.request(tenant_id, request_id)
    return info.chosen_request_id if info is not None else None


def _from_projection(request: Request, tenant_id: str, request_id: str) -> dict[str, Any] | None:
    try:
        return generation_status(projection_db(request), tenant_id, request_id)
    except SQLAlchemyError as exc:  # no projection database here (e.g. no projector deployed)
        logger.debug("generation status from the projection unavailable: %s", type(exc).__name__)
        return None
