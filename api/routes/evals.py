"""`/v1/admin/evals`: the eval table (per task and revision, a quality score in [0, 1]),
for operators. An upload is one admin event (`pipelines.rollouts.evals`), all its rows or none."""
from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.admin_access import OperatorDep
from api.deps import ServicesDep
from api.routes.admin import run
from pipelines.rollouts import evals

router = APIRouter(prefix="/v1/admin")


class EvalRowBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: str = Field(min_length=1, max_length=128)
    model_revision: str = Field(min_length=1, max_length=200)
    score: float = Field(ge=0, le=1)
    samples: int = Field(default=1, ge=1, le=1_000_000_000)


class EvalTableBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = Field(min_length=1, max_length=200)
    rows: list[EvalRowBody] = Field(min_length=1, max_length=10_000)


@router.post("/evals", status_code=201)
def upload_evals(body: EvalTableBody, actor: OperatorDep, svc: ServicesDep):
    env = run(evals.record, view=svc.registry_view, rows=[r.model_dump() for r in body.rows], source=body.source,
              actor=str(actor))
    return {"source": body.source, "rows": len(env.payload.rows), "event_id": str(env.event_id)}


@router.get("/evals")
def list_evals(actor: OperatorDep, svc: ServicesDep, task: str | None = None, model_revision: str | None = None):
    return {"data": evals.table(svc.registry_view.refresh(), task=task, model_revision=model_revision)}
