"""`/v1/admin/rollouts` and `/v1/admin/revisions/{revision}/drain`: an alias's routing
table, for operators. Each change is one admin event (`pipelines.rollouts.commands`); what these
routes show is read from the same registry state that routes requests, so a rollout
shown promoted has moved its alias."""
from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.admin_access import OperatorDep
from api.deps import ServicesDep
from api.errors import ApiError
from api.routes.admin import run
from api.deps import ProjectionDbDep
from pipelines.rollouts import commands as rollouts
from pipelines.projections.queries import rollout_history

router = APIRouter(prefix="/v1/admin")


class GuardrailsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_samples: int | None = Field(default=None, ge=1, le=1_000_000)
    max_ttft_p95_ratio: float | None = Field(default=None, gt=0, le=1000)
    max_tpot_p95_ratio: float | None = Field(default=None, gt=0, le=1000)
    max_error_rate_delta: float | None = Field(default=None, ge=0, le=1)
    max_timeout_rate_delta: float | None = Field(default=None, ge=0, le=1)
    min_median_similarity: float | None = Field(default=None, ge=-1, le=1)
    max_eval_score_drop: float | None = Field(default=None, ge=0, le=1)


class RolloutBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alias: str = Field(min_length=1, max_length=128)
    candidate_revision: str = Field(min_length=1, max_length=256)
    mode: Literal["canary", "shadow"] = "canary"
    steps: list[float] = Field(default_factory=lambda: list(rollouts.DEFAULT_STEPS), min_length=1, max_length=100)
    step_duration_s: float = Field(default=300.0, gt=0, le=30 * 24 * 3600)
    guardrails: GuardrailsBody = GuardrailsBody()


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="manual", min_length=1, max_length=500)


def _shown(svc, rollout_id: str) -> dict:
    return rollouts.describe(svc.registry_view.refresh().rollouts[rollout_id])


@router.post("/rollouts", status_code=201)
def start_rollout(body: RolloutBody, actor: OperatorDep, svc: ServicesDep):
    guardrails = body.guardrails.model_dump(exclude_none=True)
    env = run(rollouts.start, view=svc.registry_view, alias=body.alias, candidate_revision=body.candidate_revision,
              actor=str(actor), mode=body.mode, steps=tuple(body.steps), step_duration_s=body.step_duration_s,
              guardrails=guardrails)
    return _shown(svc, env.payload.rollout_id)


@router.get("/rollouts")
def list_rollouts(actor: OperatorDep, svc: ServicesDep, alias: str | None = None, ended: bool = False):
    registry = svc.registry_view.refresh()
    shown = registry.rollouts.values() if ended else registry.open_rollouts.values()
    return {"data": [rollouts.describe(r) for r in sorted(shown, key=lambda r: r.started_at)
                     if alias is None or r.alias == alias]}


@router.get("/rollouts/history/{rollout_id}")
def get_rollout_history(rollout_id: str, actor: OperatorDep, db: ProjectionDbDep):
    """A rollout's events as projected to SQL (the projector's pace behind the log)."""
    events = rollout_history(db, rollout_id)
    if not events:
        raise ApiError(404, f"no rollout {rollout_id!r} is projected", code="not_found")
    return {"rollout_id": rollout_id, "data": events}


@router.get("/rollouts/{alias}")
def get_rollout(alias: str, actor: OperatorDep, svc: ServicesDep):
    rollout = svc.registry_view.refresh().open_rollouts.get(alias)
    if rollout is None:
        raise ApiError(404, f"alias {alias!r} has no rollout under way", code="not_found")
    return rollouts.describe(rollout)


class CandidateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    candidate_revision: str = Field(min_length=1, max_length=256)


@router.post("/rollouts/{alias}/candidate")
def replace_candidate(alias: str, body: CandidateBody, actor: OperatorDep, svc: ServicesDep):
    """Another candidate for the alias's rollout: back to the first step, analysis afresh."""
    env = run(rollouts.replace, view=svc.registry_view, alias=alias, candidate_revision=body.candidate_revision,
              actor=str(actor))
    return _shown(svc, env.payload.rollout_id)


@router.post("/rollouts/{alias}/{action}")
def change_rollout(alias: str, action: Literal["step", "pause", "resume", "promote", "rollback"], actor: OperatorDep,
                   svc: ServicesDep, body: RollbackBody | None = None):
    options = {"reason": body.reason} if action == "rollback" and body is not None else {}
    env = run(getattr(rollouts, action), view=svc.registry_view, alias=alias, actor=str(actor), **options)
    return _shown(svc, env.payload.rollout_id)


@router.post("/revisions/{model_revision:path}/drain")
def drain_revision(model_revision: str, actor: OperatorDep, svc: ServicesDep):
    """Every alias's traffic leaves the revision at once (409 where an alias would have
    nowhere else to go)."""
    env, moved = run(rollouts.drain, view=svc.registry_view, model_revision=model_revision, actor=str(actor))
    return {"model_revision": model_revision, "aliases": moved, "event_id": str(env.event_id)}
