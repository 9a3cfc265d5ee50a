"""Rollouts are admin events: an alias's routing table changes only by these, so a replay
of the admin topic tells which revision an alias sent each caller to, and why.

A rollout moves an alias from its stable revision to a candidate in steps of traffic
share (`weight_percent`); it pauses, resumes, steps, is promoted (the alias then points at
the candidate) or rolled back (the alias stays on stable, no new request reaches the
candidate). At most one rollout per alias is open at a time.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from models.event_types import Payload, event

RolloutMode = Literal["canary", "shadow"]


class Guardrails(Payload):
    """What a step's analysis compares, candidate against stable over the same window."""

    min_samples: int = Field(default=50, ge=1)  # ended generations per arm, fewer: inconclusive
    max_ttft_p95_ratio: float = Field(default=1.5, gt=0)  # candidate p95 / stable p95
    max_tpot_p95_ratio: float = Field(default=1.5, gt=0)
    max_error_rate_delta: float = Field(default=0.05, ge=0, le=1)  # candidate rate - stable rate
    max_timeout_rate_delta: float = Field(default=0.05, ge=0, le=1)
    # Shadow rollouts: the median text similarity of candidate to stable answers a step must
    # reach (`ShadowCompared`); absent, similarity is recorded but gates nothing.
    min_median_similarity: float | None = Field(default=None, ge=-1, le=1, exclude_if=lambda v: v is None)
    # Quality from the eval table (`EvalScoresRecorded`): on every task stable has a score
    # for, the candidate's may be at most this much lower; a task the candidate has no score
    # for leaves the step inconclusive. Absent, eval scores gate nothing.
    max_eval_score_drop: float | None = Field(default=None, ge=0, le=1, exclude_if=lambda v: v is None)


@event("RolloutStarted")
class RolloutStarted(Payload):
    rollout_id: str
    alias: str
    stable_revision: str
    candidate_revision: str
    mode: RolloutMode = "canary"
    # Traffic shares in percent, rising; a canary's last is 100 (then it may be promoted).
    steps: tuple[float, ...]
    step_duration_s: float = Field(gt=0)
    guardrails: Guardrails = Guardrails()
    actor: str

    @model_validator(mode="after")
    def _rising(self) -> "RolloutStarted":
        if not self.steps or any(not 0 < s <= 100 for s in self.steps):
            raise ValueError("steps are traffic shares in percent, each above 0 and at most 100")
        if any(b <= a for a, b in zip(self.steps, self.steps[1:])):
            raise ValueError("steps must rise")
        if self.stable_revision == self.candidate_revision:
            raise ValueError("the candidate must differ from the stable revision")
        return self


@event("RolloutStepped")
class RolloutStepped(Payload):
    """The candidate's share is now `weight_percent` (step `step` of the plan)."""

    rollout_id: str
    step: int = Field(ge=0)
    weight_percent: float = Field(gt=0, le=100)
    reason: Literal["manual", "analysis"] = "manual"
    actor: str


@event("RolloutPaused")
class RolloutPaused(Payload):
    """The share holds where it is and nothing steps until resumed. `inconclusive`: too few
    samples for a verdict (never a pass, never an abort)."""

    rollout_id: str
    reason: Literal["manual", "inconclusive"] = "manual"
    detail: str | None = None
    actor: str


@event("RolloutResumed")
class RolloutResumed(Payload):
    rollout_id: str
    actor: str


@event("RolloutCandidateReplaced")
class RolloutCandidateReplaced(Payload):
    """The rollout goes on with another candidate (a fixed build, say): back to the first
    step's share, a pause lifted, and the analysis starts over on the new candidate alone.
    The same callers are its canary (assignment keys on the rollout, not the revision)."""

    rollout_id: str
    candidate_revision: str
    replaced_revision: str
    actor: str


@event("RolloutPromoted")
class RolloutPromoted(Payload):
    """The alias points at the candidate for everyone; the rollout is over."""

    rollout_id: str
    actor: str


@event("RolloutRolledBack")
class RolloutRolledBack(Payload):
    """No new request goes to the candidate; running generations finish where they are.
    An automatic rollback names the figure that breached and its threshold."""

    rollout_id: str
    reason: str
    figure: str | None = None
    value: float | None = None
    threshold: float | None = None
    actor: str


@event("RevisionDrained")
class RevisionDrained(Payload):
    """Every alias's traffic leaves the revision at once: rollouts whose candidate it is are
    rolled back, and those whose stable it is are promoted where their candidate is ready."""

    model_revision: str
    actor: str


@event("ShadowCompared")
class ShadowCompared(Payload):
    """A shadow copy's answer against the stable answer its client got (the outcomes topic,
    under the shadow account): how alike the texts are (cosine of MiniLM embeddings; None
    when no embedder ran) and what the candidate took and made, as deltas to stable."""

    rollout_id: str
    request_id: str  # the client's, served by stable
    shadow_request_id: str
    similarity: float | None = None
    stable_output_tokens: int = Field(ge=0)
    candidate_output_tokens: int = Field(ge=0)
    ttft_delta_ms: int | None = None  # candidate less stable
    duration_delta_ms: int | None = None
