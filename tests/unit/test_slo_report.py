"""The SLO report's arithmetic over rows shaped as the `generations` projection's: p95 by
nearest rank per revision and class, time per output token, availability with client
cancels and work in flight left out, and rejections kept apart by reason."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from models.prompt_class import PromptThresholds
from pipelines.projections.slo import parse_window, summarize

T0 = datetime(2025, 6, 1, tzinfo=timezone.utc)
THRESHOLDS = PromptThresholds(short_max_tokens=100, long_min_tokens=1000)


def row(status="completed", *, revision="tiny@r1", prompt=50, reject=None, code=None, cached=None, queued=0, ttft=10,
        duration=100, output=10):
    return {"model_revision": revision, "prompt_tokens": prompt, "status": status, "reject_reason": reject,
            "error_code": code, "cache_entry_id": cached, "queued_ms": queued, "ttft_ms": ttft, "duration_ms": duration,
            "output_tokens": output}


def report(rows, revision=None):
    return summarize(rows, since=T0, until=T0 + timedelta(hours=1), thresholds=THRESHOLDS, revision=revision)


def test_p95_is_the_nearest_rank_per_revision_and_class_with_the_queue_in_ttft():
    # Twenty short ones: TTFT 10..200 (5 of each queued, 5..195 by the worker); p95 is the 19th.
    rows = [row(queued=5, ttft=10 * i - 5, duration=10 * i - 5 + 9 * i, output=10) for i in range(1, 21)]
    rows += [row(revision="tiny@r2", prompt=5000, ttft=700, duration=1700, output=11)]  # long, elsewhere
    rows += [row(prompt=101, ttft=40, duration=40, output=1)]  # medium: no time per token with one token
    got = {(x.model_revision, x.prompt_class): x for x in report(rows).latency}
    assert list(got) == [("tiny@r1", "short"), ("tiny@r1", "medium"), ("tiny@r2", "long")]
    short = got[("tiny@r1", "short")]
    assert (short.generations, short.ttft_p95_ms) == (20, 190)
    assert (short.tpot_generations, short.tpot_p95_ms) == (20, 19.0)  # 9*i ms over 9 gaps: i, and the 19th is 19
    assert (got[("tiny@r2", "long")].ttft_p95_ms, got[("tiny@r2", "long")].tpot_p95_ms) == (700, 100.0)
    medium = got[("tiny@r1", "medium")]
    assert (medium.generations, medium.ttft_p95_ms, medium.tpot_generations, medium.tpot_p95_ms) == (1, 40, 0, None)


def test_latency_counts_only_completed_engine_runs():
    rows = [row(ttft=30), row(cached="entry-1", ttft=0, queued=0), row("failed", ttft=999),
            row("cancelled", code="client", ttft=999), row("running", ttft=None)]
    (only,) = report(rows).latency
    assert (only.generations, only.ttft_p95_ms) == (1, 30)


def test_availability_leaves_out_client_cancels_and_work_in_flight():
    rows = ([row()] * 6 + [row(cached="entry-1")] + [row("failed"), row("expired"), row("cancelled", code="deadline"),
                                                     row("cancelled", code="admin"), row("cancelled", code="client"),
                                                     row("cancelled", code="client_gone"), row("queued"),
                                                     row("running")]
            + [row(reject="rate"), row(reject="tokens"), row(reject="rate"), row("requested")])
    r = report(rows)
    t = r.total
    assert (t.admitted, t.completed, t.failed, t.expired, t.cancelled, t.cancelled_by_client, t.in_flight) == \
        (15, 7, 1, 1, 2, 2, 2)
    assert t.judged == 11 and t.availability == pytest.approx(7 / 11)
    assert r.rejections_by_reason() == {"rate": {"short": 2, "all": 2}, "tokens": {"short": 1, "all": 1}}


def test_availability_and_rejections_per_revision_and_class():
    rows = [row(prompt=10), row("failed", prompt=2000), row(prompt=2000), row(revision="tiny@r2", prompt=500),
            row(reject="shed", prompt=2000), row(reject="shed", prompt=3000, revision="tiny@r2"),
            row(reject="kv_capacity", prompt=1500), row("expired", prompt=None)]
    r = report(rows)
    per_class = {(a.model_revision, a.prompt_class): (a.admitted, a.completed, a.availability) for a in r.availability}
    assert per_class == {("tiny@r1", "short"): (1, 1, 1.0), ("tiny@r1", "long"): (2, 1, 0.5),
                         ("tiny@r2", "medium"): (1, 1, 1.0)}
    # A row of unknown prompt length counts for its revision, in no class.
    assert {a.model_revision: (a.admitted, a.availability) for a in r.by_revision} == {
        "tiny@r1": (4, 0.5), "tiny@r2": (1, 1.0)}
    assert [(x.model_revision, x.prompt_class, x.reason, x.count) for x in r.rejections] == [
        ("tiny@r1", "long", "kv_capacity", 1), ("tiny@r1", "long", "shed", 1), ("tiny@r2", "long", "shed", 1)]
    assert r.rejections_by_reason() == {"shed": {"long": 2, "all": 2}, "kv_capacity": {"long": 1, "all": 1}}


def test_an_empty_window_has_no_figures_and_no_availability():
    r = report([row(reject="rate")])
    assert r.latency == [] and r.availability == [] and r.total.availability is None
    assert r.as_dict()["total"]["availability"] is None and r.as_dict()["rejections_by_reason"] == {
        "rate": {"short": 1, "all": 1}}


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("15m", 900), ("1h", 3600), ("7d", 604800),
                                               ("30", 30), ("1.5h", 5400)])
def test_windows_are_read_with_their_units(text, seconds):
    assert parse_window(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "0h", "-1h", "1w", "h", "one hour"])
def test_a_window_that_means_nothing_is_refused(text):
    with pytest.raises(ValueError, match="not a window"):
        parse_window(text)
