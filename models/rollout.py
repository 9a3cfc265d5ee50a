"""An alias's routing table while a rollout is open, and who it sends where.

Assignment is a pure function of (alias, rollout, stickiness key) and the candidate's
current share: each key has a fixed point in [0, 1) for the rollout, and is sent to the
candidate while its point lies below the share. So a caller stays on one revision while
the share holds, and raising the share only moves callers from stable to candidate, never
back. The stickiness key is the OpenAI `user` field when given, else tenant and
application (`stickiness_key`). The rollout id is part of the point: a new rollout draws
its canary afresh, so the same callers are not always the first to try a candidate.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime

from models.events_rollout import Guardrails, RolloutMode

ARM_STABLE, ARM_CANDIDATE = "stable", "candidate"
# The platform account shadow copies run under: their usage and cost are never a tenant's.
# Not a valid tenant id (tenants start with a letter or digit), so no tenant can be it.
SHADOW_TENANT = "_shadow"


def stickiness_key(tenant_id: str, application_id: str, user: str | None = None) -> str:
    """Who a caller is, for assignment: within a tenant, its `user` if it names one, else
    its application (a key of the tenant's application)."""
    return f"{tenant_id}\x1fuser\x1f{user}" if user else f"{tenant_id}\x1fapp\x1f{application_id}"


def point(alias: str, rollout_id: str, key: str) -> float:
    """The key's fixed place in [0, 1) for this rollout (64 bits of SHA-256)."""
    digest = hashlib.sha256(f"{alias}\x00{rollout_id}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


@dataclass
class RolloutState:
    rollout_id: str
    alias: str
    stable_revision: str
    candidate_revision: str
    mode: RolloutMode
    steps: tuple[float, ...]
    step_duration_s: float
    guardrails: Guardrails
    started_at: datetime
    step: int = 0
    weight_percent: float = 0.0
    paused: str | None = None  # why, while paused: 'manual' or 'inconclusive'
    stepped_at: datetime | None = None  # when the current step (or its analysis) began
    outcome: str = "open"  # then 'promoted' or 'rolled_back'
    ended_at: datetime | None = None
    history: list[dict] = field(default_factory=list)  # every event of the rollout: at, event, details

    def arm_for(self, key: str) -> str:
        """Which arm the key is on now. A shadow rollout serves everyone from stable (the
        candidate gets copies; `mirrors` says whose)."""
        if self.mode == "shadow":
            return ARM_STABLE
        return ARM_CANDIDATE if point(self.alias, self.rollout_id, key) < self.weight_percent / 100 else ARM_STABLE

    def mirrors(self, key: str) -> bool:
        """Whether a shadow rollout copies this key's request to the candidate."""
        return self.mode == "shadow" and point(self.alias, self.rollout_id, key) < self.weight_percent / 100

    def revision_of(self, arm: str) -> str:
        return self.candidate_revision if arm == ARM_CANDIDATE else self.stable_revision

    @property
    def next_step(self) -> int | None:
        return self.step + 1 if self.step + 1 < len(self.steps) else None

    def status(self) -> str:
        if self.outcome != "open":
            return self.outcome.replace("_", " ")
        return f"paused: {self.paused}" if self.paused else "progressing"


@dataclass(frozen=True)
class Route:
    """Where one request goes: the revision, and the rollout and arm that chose it (None
    when the alias has no open rollout)."""

    model_revision: str
    rollout_id: str | None = None
    arm: str | None = None


def apply_rollout(rollouts: dict[str, RolloutState], open_by_alias: dict[str, RolloutState], env) -> None:
    """Applies one rollout event to the rollouts (by id) and the open one of each alias.
    Events for an unknown or ended rollout change nothing (the admin commands refuse to
    write them; a replay stays deterministic all the same)."""
    from models.events_rollout import (
        RevisionDrained, RolloutCandidateReplaced, RolloutPaused, RolloutPromoted, RolloutResumed, RolloutRolledBack,
        RolloutStarted, RolloutStepped,
    )
    p, at = env.payload, env.occurred_at

    def note(state: RolloutState, what: str, **details) -> None:
        state.history.append({"at": at.isoformat(), "event": what, **details})

    def end(state: RolloutState, outcome: str, what: str, **details) -> None:
        state.outcome, state.ended_at, state.paused = outcome, at, None
        open_by_alias.pop(state.alias, None)
        note(state, what, **details)

    if isinstance(p, RolloutStarted):
        if p.alias in open_by_alias or p.rollout_id in rollouts:
            return
        state = RolloutState(p.rollout_id, p.alias, p.stable_revision, p.candidate_revision, p.mode, tuple(p.steps),
                             p.step_duration_s, p.guardrails, started_at=at, weight_percent=p.steps[0], stepped_at=at)
        rollouts[p.rollout_id] = open_by_alias[p.alias] = state
        note(state, "started", weight_percent=p.steps[0], actor=p.actor)
        return
    if isinstance(p, RevisionDrained):
        for state in list(open_by_alias.values()):
            if state.candidate_revision == p.model_revision:
                end(state, "rolled_back", "rolled_back", reason="drained", actor=p.actor)
            elif state.stable_revision == p.model_revision:
                end(state, "promoted", "promoted", reason="drained", actor=p.actor)
        return
    state = rollouts.get(getattr(p, "rollout_id", ""))
    if state is None or state.outcome != "open":
        return
    if isinstance(p, RolloutStepped):
        state.step, state.weight_percent, state.paused, state.stepped_at = p.step, p.weight_percent, None, at
        note(state, "stepped", step=p.step, weight_percent=p.weight_percent, reason=p.reason, actor=p.actor)
    elif isinstance(p, RolloutPaused):
        state.paused = p.reason
        note(state, "paused", reason=p.reason, detail=p.detail, actor=p.actor)
    elif isinstance(p, RolloutResumed):
        state.paused, state.stepped_at = None, at  # the step's analysis starts over
        note(state, "resumed", actor=p.actor)
    elif isinstance(p, RolloutCandidateReplaced):
        state.candidate_revision, state.step, state.weight_percent = p.candidate_revision, 0, state.steps[0]
        state.paused, state.stepped_at = None, at
        note(state, "candidate_replaced", candidate_revision=p.candidate_revision,
             replaced_revision=p.replaced_revision, weight_percent=state.steps[0], actor=p.actor)
    elif isinstance(p, RolloutPromoted):
        end(state, "promoted", "promoted", actor=p.actor)
    elif isinstance(p, RolloutRolledBack):
        end(state, "rolled_back", "rolled_back", reason=p.reason, figure=p.figure, value=p.value,
            threshold=p.threshold, actor=p.actor)
