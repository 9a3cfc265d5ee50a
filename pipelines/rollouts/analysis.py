"""A rollout step's verdict, from the generations each arm served during it.

Per step, over requests made since the step began, candidate against stable: TTFT p95 and
time per output token p95 (as ratios), and the rates of failures and of timeouts (as
differences); where the guardrails ask, the shadow pairs' median similarity and the eval
table's per-task scores (a candidate scoring too far below stable rolls back at once, one
without a score leaves the step inconclusive). A breach rolls back at once, as soon as both arms have `min_samples`; with
fewer by the step's end, the rollout pauses as inconclusive (neither a pass nor an
abort, however long it waits); a step that ran its time clean moves to the next, and the
last one, clean, promotes. Pure: `judge` sees samples and a time, so a replay of the same
log reaches the same verdicts.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from models.events_generation import GenerationCancelled, GenerationCompleted, GenerationFailed
from models.rollout import ARM_CANDIDATE, ARM_STABLE, RolloutState

TIMEOUT_CODES = frozenset({"expired", "deadline_expired", "timeout"})
MIN_MS = 1.0  # a stable figure below this is taken as this, so a ratio never divides by ~0


@dataclass(frozen=True)
class Sample:
    arm: str
    outcome: Literal["completed", "failed", "timeout"]
    ttft_ms: float | None = None
    tpot_ms: float | None = None


def sample_of(arm: str, payload) -> Sample | None:
    """What one terminal says of its arm; None for an end that says nothing of the revision
    (a cancel by the client or an admin)."""
    if isinstance(payload, GenerationCompleted):
        t = payload.timings
        tpot = ((t.duration_ms - t.ttft_ms) / (payload.output_tokens - 1)
                if t.ttft_ms is not None and payload.output_tokens > 1 else None)
        return Sample(arm, "completed", t.ttft_ms, tpot)
    if isinstance(payload, GenerationFailed):
        return Sample(arm, "timeout" if payload.error_code in TIMEOUT_CODES else "failed")
    if isinstance(payload, GenerationCancelled) and payload.reason == "deadline":
        return Sample(arm, "timeout")
    return None


@dataclass(frozen=True)
class Verdict:
    action: Literal["wait", "step", "promote", "pause", "rollback"]
    figure: str | None = None
    value: float | None = None
    threshold: float | None = None
    detail: str | None = None


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def figures(stable: list[Sample], candidate: list[Sample]) -> dict[str, float]:
    """Candidate against stable: p95 ratios (where both arms have values) and rate deltas."""
    out: dict[str, float] = {}
    for name in ("ttft_ms", "tpot_ms"):
        s = p95([getattr(x, name) for x in stable if getattr(x, name) is not None])
        c = p95([getattr(x, name) for x in candidate if getattr(x, name) is not None])
        if s is not None and c is not None:
            out[f"{name[:-3]}_p95_ratio"] = c / max(s, MIN_MS)
    for outcome in ("failed", "timeout"):
        rate = [sum(x.outcome == outcome for x in arm) / len(arm) if arm else 0.0 for arm in (stable, candidate)]
        out["error_rate_delta" if outcome == "failed" else "timeout_rate_delta"] = rate[1] - rate[0]
    return out


def judge(rollout: RolloutState, samples: list[Sample], now: datetime, baseline: list[Sample] = (),
          similarities: list[float] = (), evals: dict[str, tuple[float, float | None]] | None = None) -> Verdict:
    """`baseline`: stable's samples of the step before, compared against where this step
    sends stable nothing (a share of 100 %). `similarities`: the step's shadow pairs'
    (`ShadowCompared`), gating a shadow rollout whose guardrails set a median bar. `evals`:
    {task: (stable's score, the candidate's or None)} from the eval table, gating where the
    guardrails set `max_eval_score_drop`."""
    g = rollout.guardrails
    quality = _quality(g.max_eval_score_drop, evals or {})
    if isinstance(quality, Verdict):
        return quality
    stable = [s for s in samples if s.arm == ARM_STABLE] or [s for s in baseline if s.arm == ARM_STABLE]
    candidate = [s for s in samples if s.arm == ARM_CANDIDATE]
    enough = len(stable) >= g.min_samples and len(candidate) >= g.min_samples
    gated = g.min_median_similarity is not None and rollout.mode == "shadow"
    if gated and len(similarities) >= g.min_samples:
        median = statistics.median(similarities)
        if median < g.min_median_similarity:
            return Verdict("rollback", "median_similarity", round(median, 4), g.min_median_similarity,
                           f"median similarity {median:.3f} below {g.min_median_similarity:g} over "
                           f"{len(similarities)} shadow pairs")
    elif gated:
        enough = False  # no verdict on the answers yet
    if enough:
        got = figures(stable, candidate)
        for figure, threshold in (("ttft_p95_ratio", g.max_ttft_p95_ratio), ("tpot_p95_ratio", g.max_tpot_p95_ratio),
                                  ("error_rate_delta", g.max_error_rate_delta),
                                  ("timeout_rate_delta", g.max_timeout_rate_delta)):
            if figure in got and got[figure] > threshold:
                return Verdict("rollback", figure, round(got[figure], 4), threshold,
                               f"{figure} {got[figure]:.3g} above {threshold:g} over {len(candidate)} candidate and "
                               f"{len(stable)} stable generations")
    if rollout.stepped_at is None or (now - rollout.stepped_at).total_seconds() < rollout.step_duration_s:
        return Verdict("wait")
    if not enough:
        pairs = f", {len(similarities)} compared pairs" if gated else ""
        return Verdict("pause", detail=f"inconclusive: {len(candidate)} candidate and {len(stable)} stable "
                                       f"generations in the step{pairs}, {g.min_samples} needed of each"
                                       + (f"; {quality}" if quality else ""))
    if quality:
        return Verdict("pause", detail=f"inconclusive: {quality}")
    return Verdict("step" if rollout.next_step is not None else "promote")


def _quality(max_drop: float | None, evals: dict[str, tuple[float, float | None]]) -> Verdict | str | None:
    """The eval gate: a rollback verdict where the candidate scores more than `max_drop`
    below stable on a task; what it still lacks (a phrase) where a score is missing; None
    when it passes or gates nothing."""
    if max_drop is None:
        return None
    if not evals:
        return "the eval table has no score for the stable revision"
    for task, (stable, candidate) in evals.items():
        if candidate is not None and stable - candidate > max_drop + 1e-12:
            return Verdict("rollback", "eval_score_drop", round(stable - candidate, 4), max_drop,
                           f"on task {task!r} the candidate scores {candidate:.3g} against stable's {stable:.3g}")
    unscored = [task for task, (_, candidate) in evals.items() if candidate is None]
    if unscored:
        return f"the eval table has no candidate score for {', '.join(map(repr, unscored))}"
    return None
