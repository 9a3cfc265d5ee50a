"""Rollout commands: each checks the registry as the admin topic has it, then appends one
admin event (`models.events_rollout`). The registry applies them, so every process that
follows the admin topic routes by the same table (`Registry.route`)."""
from __future__ import annotations

import uuid

from pydantic import ValidationError

from models.events import Envelope
from models.events_rollout import (
    Guardrails, RevisionDrained, RolloutCandidateReplaced, RolloutPaused, RolloutPromoted, RolloutResumed,
    RolloutRolledBack, RolloutStarted, RolloutStepped,
)
from models.rollout import RolloutState
from pipelines.admin.commands import PLATFORM, AdminConflict, AdminError, AdminNotFound, RegistryView, _admin_event, _append

DEFAULT_STEPS = (1.0, 5.0, 25.0, 50.0, 100.0)


def _validation(exc: ValidationError) -> AdminError:
    return AdminError("; ".join(f"{'.'.join(map(str, e['loc'])) or 'rollout'}: {e['msg']}"
                                for e in exc.errors(include_url=False)))


def _write(view: RegistryView, payload) -> Envelope:
    env = _admin_event(payload, PLATFORM)
    _append(view._log, env)
    return env


def open_rollout(view: RegistryView, alias: str, expected: tuple | None = None) -> RolloutState:
    """The alias's open rollout; with `expected` (rollout id, step[, candidate revision]),
    only while it is still there (a verdict reached on one step, or on one candidate, is
    not written onto the next)."""
    rollout = view.refresh().open_rollouts.get(alias)
    if rollout is None:
        raise AdminNotFound(f"alias {alias!r} has no rollout under way")
    now = (rollout.rollout_id, rollout.step, rollout.candidate_revision)
    if expected is not None and now[:len(expected)] != tuple(expected):
        raise AdminConflict(f"rollout of {alias!r} moved on: it is {rollout.rollout_id} at step {rollout.step} "
                            f"with candidate {rollout.candidate_revision}, not {' / '.join(map(str, expected))}")
    return rollout


def start(view: RegistryView, *, alias: str, candidate_revision: str, actor: str, mode: str = "canary",
          steps: tuple[float, ...] = DEFAULT_STEPS, step_duration_s: float = 300.0,
          guardrails: dict | None = None, rollout_id: str | None = None) -> Envelope:
    """Starts moving `alias` from the revision it points at to `candidate_revision`, at the
    first step's share."""
    registry = view.refresh()
    entry = registry.aliases.get(alias)
    if entry is None:
        raise AdminNotFound(f"alias {alias!r} does not exist")
    if alias in registry.open_rollouts:
        raise AdminConflict(f"alias {alias!r} has a rollout under way ({registry.open_rollouts[alias].rollout_id}); "
                            f"promote or roll it back first")
    if candidate_revision not in registry.revisions:
        raise AdminNotFound(f"model revision {candidate_revision!r} is not approved")
    if registry.pinnable(candidate_revision) is None:
        raise AdminConflict(f"model revision {candidate_revision!r} is retired")
    if registry.pinnable(entry.model_revision) is None:
        raise AdminConflict(f"alias {alias!r} points at retired revision {entry.model_revision!r}: set it instead")
    try:
        payload = RolloutStarted(
            rollout_id=rollout_id or "ro_" + uuid.uuid4().hex[:16], alias=alias, stable_revision=entry.model_revision,
            candidate_revision=candidate_revision, mode=mode, steps=tuple(steps), step_duration_s=step_duration_s,
            guardrails=Guardrails(**(guardrails or {})), actor=actor)
    except (ValidationError, TypeError) as exc:
        raise (_validation(exc) if isinstance(exc, ValidationError) else AdminError(str(exc))) from None
    return _write(view, payload)


def replace(view: RegistryView, *, alias: str, candidate_revision: str, actor: str) -> Envelope:
    """Another candidate for the open rollout: back to its first step, the analysis afresh."""
    rollout = open_rollout(view, alias)
    registry = view.registry
    if candidate_revision not in registry.revisions:
        raise AdminNotFound(f"model revision {candidate_revision!r} is not approved")
    if registry.pinnable(candidate_revision) is None:
        raise AdminConflict(f"model revision {candidate_revision!r} is retired")
    if candidate_revision in (rollout.stable_revision, rollout.candidate_revision):
        role = "stable revision" if candidate_revision == rollout.stable_revision else "candidate already"
        raise AdminConflict(f"{candidate_revision!r} is the rollout's {role}")
    return _write(view, RolloutCandidateReplaced(rollout_id=rollout.rollout_id, candidate_revision=candidate_revision,
                                                 replaced_revision=rollout.candidate_revision, actor=actor))


def step(view: RegistryView, *, alias: str, actor: str, reason: str = "manual",
         expected: tuple | None = None) -> Envelope:
    """The next step of the plan: the candidate's share rises to it (and a pause ends)."""
    rollout = open_rollout(view, alias, expected)
    following = rollout.next_step
    if following is None:
        raise AdminConflict(f"rollout {rollout.rollout_id} is at its last step "
                            f"({rollout.weight_percent:g} %): promote it or roll it back")
    return _write(view, RolloutStepped(rollout_id=rollout.rollout_id, step=following,
                                       weight_percent=rollout.steps[following], reason=reason, actor=actor))


def pause(view: RegistryView, *, alias: str, actor: str, reason: str = "manual", detail: str | None = None,
          expected: tuple | None = None) -> Envelope:
    rollout = open_rollout(view, alias, expected)
    if rollout.paused:
        raise AdminConflict(f"rollout {rollout.rollout_id} is already paused ({rollout.paused})")
    return _write(view, RolloutPaused(rollout_id=rollout.rollout_id, reason=reason, detail=detail, actor=actor))


def resume(view: RegistryView, *, alias: str, actor: str) -> Envelope:
    rollout = open_rollout(view, alias)
    if not rollout.paused:
        raise AdminConflict(f"rollout {rollout.rollout_id} is not paused")
    return _write(view, RolloutResumed(rollout_id=rollout.rollout_id, actor=actor))


def promote(view: RegistryView, *, alias: str, actor: str, expected: tuple | None = None) -> Envelope:
    """The alias points at the candidate for everyone; the rollout ends."""
    rollout = open_rollout(view, alias, expected)
    if view.registry.pinnable(rollout.candidate_revision) is None:
        raise AdminConflict(f"candidate {rollout.candidate_revision!r} is retired: roll the rollout back")
    return _write(view, RolloutPromoted(rollout_id=rollout.rollout_id, actor=actor))


def rollback(view: RegistryView, *, alias: str, actor: str, reason: str = "manual", figure: str | None = None,
             value: float | None = None, threshold: float | None = None,
             expected: tuple | None = None) -> Envelope:
    """No new request goes to the candidate; what runs on it finishes."""
    rollout = open_rollout(view, alias, expected)
    return _write(view, RolloutRolledBack(rollout_id=rollout.rollout_id, reason=reason, figure=figure, value=value,
                                          threshold=threshold, actor=actor))


def drain(view: RegistryView, *, model_revision: str, actor: str) -> tuple[Envelope, list[str]]:
    """Moves every alias's traffic off `model_revision` at once: rollouts to it are rolled
    back, rollouts from it promoted. Refused (nothing written) when an alias points at it
    with no rollout, since its traffic would have nowhere to go. Returns the event and the
    aliases it moves."""
    registry = view.refresh()
    if model_revision not in registry.revisions:
        raise AdminNotFound(f"model revision {model_revision!r} is not approved")
    stranded = sorted(a.alias for a in registry.aliases.values()
                      if a.model_revision == model_revision and a.alias not in registry.open_rollouts)
    if stranded:
        raise AdminConflict(f"aliases {stranded} point at {model_revision!r} with no rollout under way: their "
                            f"traffic has nowhere else to go (start a rollout or set the alias first)")
    moved = sorted(alias for alias, r in registry.open_rollouts.items()
                   if model_revision in (r.stable_revision, r.candidate_revision))
    if not moved:
        raise AdminConflict(f"no alias sends traffic to {model_revision!r}")
    for alias in moved:
        candidate = registry.open_rollouts[alias].candidate_revision
        if candidate != model_revision and registry.pinnable(candidate) is None:
            raise AdminConflict(f"alias {alias!r} would move to retired revision {candidate!r}")
    return _write(view, RevisionDrained(model_revision=model_revision, actor=actor)), moved


def describe(rollout: RolloutState) -> dict:
    """A rollout as `status` shows it, from the same registry state that routes requests."""
    return {
        "rollout_id": rollout.rollout_id, "alias": rollout.alias, "mode": rollout.mode,
        "stable_revision": rollout.stable_revision, "candidate_revision": rollout.candidate_revision,
        "status": rollout.status(), "step": rollout.step, "steps": list(rollout.steps),
        "weight_percent": rollout.weight_percent, "step_duration_s": rollout.step_duration_s,
        "guardrails": rollout.guardrails.model_dump(), "started_at": rollout.started_at.isoformat(),
        "ended_at": rollout.ended_at.isoformat() if rollout.ended_at else None, "history": list(rollout.history),
    }
