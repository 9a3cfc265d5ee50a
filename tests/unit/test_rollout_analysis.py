"""A step's verdict: a breach rolls back (naming the figure and threshold) as soon as both
arms have enough samples, too few by the step's end pauses as inconclusive and never
passes, a clean step steps and a clean last step promotes."""
from __future__ import annotations

from datetime import timedelta

from models.events_generation import GenerationCancelled, GenerationCompleted, GenerationFailed, Timings
from models.events_rollout import Guardrails
from models.rollout import ARM_CANDIDATE, ARM_STABLE, RolloutState
from pipelines.rollouts.analysis import Sample, judge, sample_of
from tests.unit.test_admission import T0


def rollout(weight=25.0, steps=(25.0, 100.0), step=0, min_samples=20) -> RolloutState:
    return RolloutState("ro", "tiny", "old", "new", "canary", steps, 60.0, Guardrails(min_samples=min_samples),
                        started_at=T0, step=step, weight_percent=weight, stepped_at=T0)


def served(arm, n, *, ttft=20.0, tpot=5.0, failed=0, timeouts=0):
    return ([Sample(arm, "completed", ttft, tpot)] * (n - failed - timeouts) + [Sample(arm, "failed")] * failed
            + [Sample(arm, "timeout")] * timeouts)


def at(seconds):
    return T0 + timedelta(seconds=seconds)


def test_a_slow_or_failing_candidate_is_rolled_back_at_once_naming_the_figure():
    slow = judge(rollout(), served(ARM_STABLE, 30) + served(ARM_CANDIDATE, 20, tpot=12.0), at(5))
    assert (slow.action, slow.figure, slow.threshold) == ("rollback", "tpot_p95_ratio", 1.5) and slow.value == 2.4
    failing = judge(rollout(), served(ARM_STABLE, 30) + served(ARM_CANDIDATE, 20, failed=3), at(5))
    assert (failing.action, failing.figure) == ("rollback", "error_rate_delta")
    late = judge(rollout(), served(ARM_STABLE, 30) + served(ARM_CANDIDATE, 20, timeouts=2), at(5))
    assert (late.action, late.figure) == ("rollback", "timeout_rate_delta")
    assert judge(rollout(), served(ARM_STABLE, 30) + served(ARM_CANDIDATE, 19, tpot=12.0), at(5)).action == "wait", \
        "not before both arms have enough"


def test_thin_traffic_pauses_as_inconclusive_and_never_passes():
    thin = served(ARM_STABLE, 30) + served(ARM_CANDIDATE, 5)
    assert judge(rollout(), thin, at(59)).action == "wait"
    for seconds in (60, 180, 600):
        verdict = judge(rollout(), thin, at(seconds))
        assert verdict.action == "pause" and "inconclusive" in verdict.detail and "5 candidate" in verdict.detail


def test_a_clean_step_steps_and_a_clean_last_step_promotes_against_the_step_before():
    clean = served(ARM_STABLE, 30) + served(ARM_CANDIDATE, 25, tpot=6.0)
    assert judge(rollout(), clean, at(61)).action == "step"
    last = rollout(weight=100.0, step=1)
    only_candidate = served(ARM_CANDIDATE, 25, tpot=6.0)
    assert judge(last, only_candidate, at(61)).action == "pause", "no stable figures to compare with"
    assert judge(last, only_candidate, at(61), baseline=served(ARM_STABLE, 30)).action == "promote"
    worse = judge(last, served(ARM_CANDIDATE, 25, ttft=80.0), at(10), baseline=served(ARM_STABLE, 30))
    assert (worse.action, worse.figure) == ("rollback", "ttft_p95_ratio")


def test_samples_from_terminals():
    done = GenerationCompleted(request_id="r", finish_reason="length", input_tokens=1, output_tokens=11,
                               model_revision="new", output_sha256="x",
                               timings=Timings(queued_ms=3, ttft_ms=40, duration_ms=140))
    assert sample_of(ARM_CANDIDATE, done) == Sample(ARM_CANDIDATE, "completed", 40, 10.0)
    assert sample_of(ARM_STABLE, GenerationFailed(request_id="r", error_code="engine_error", message="x")).outcome \
        == "failed"
    assert sample_of(ARM_STABLE, GenerationFailed(request_id="r", error_code="expired", message="x")).outcome \
        == "timeout"
    assert sample_of(ARM_STABLE, GenerationCancelled(request_id="r", reason="client")) is None
    assert sample_of(ARM_STABLE, GenerationCancelled(request_id="r", reason="deadline")).outcome == "timeout"


def test_a_shadow_rollout_with_a_similarity_bar_rolls_back_below_it_and_waits_for_enough_pairs():
    from dataclasses import replace
    shadow = replace(rollout(), mode="shadow",
                     guardrails=Guardrails(min_samples=20, min_median_similarity=0.8))
    served_both = served(ARM_STABLE, 30) + served(ARM_CANDIDATE, 25)
    unlike = judge(shadow, served_both, at(5), similarities=[0.3] * 20)
    assert (unlike.action, unlike.figure, unlike.threshold) == ("rollback", "median_similarity", 0.8)
    assert judge(shadow, served_both, at(61), similarities=[0.95] * 20).action == "step"
    few = judge(shadow, served_both, at(61), similarities=[0.95] * 5)
    assert few.action == "pause" and "5 compared pairs" in few.detail
    assert judge(replace(shadow, guardrails=Guardrails(min_samples=20)), served_both, at(61)).action == "step", \
        "no bar: similarity gates nothing"


def test_an_eval_bar_rolls_back_a_candidate_that_scores_too_low_and_pauses_one_without_a_score():
    gated = rollout()
    gated.guardrails = Guardrails(min_samples=20, max_eval_score_drop=0.02)
    clean = served(ARM_STABLE, 30) + served(ARM_CANDIDATE, 25)
    worse = judge(gated, clean, at(5), evals={"qa": (0.9, 0.9), "summarize": (0.80, 0.70)})
    assert (worse.action, worse.figure, worse.threshold, worse.value) == ("rollback", "eval_score_drop", 0.02, 0.1)
    assert "'summarize'" in worse.detail, "before the step's time: an eval breach needs no traffic"
    assert judge(gated, clean, at(61), evals={"summarize": (0.80, 0.79)}).action == "step", "within the bar"
    unscored = judge(gated, clean, at(61), evals={"summarize": (0.80, 0.79), "qa": (0.9, None)})
    assert unscored.action == "pause" and "no candidate score for 'qa'" in unscored.detail
    nothing = judge(gated, clean, at(61), evals={})
    assert nothing.action == "pause" and "no score for the stable revision" in nothing.detail
    assert judge(rollout(), clean, at(61), evals={"summarize": (0.8, 0.1)}).action == "step", \
        "without the bar, scores gate nothing"
