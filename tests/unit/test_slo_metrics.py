"""The API's latency histograms carry the prompt's class and the revision beside the pool,
under exactly the label names Prometheus rules are written against."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from api.metrics import ApiMetrics
from models.prompt_class import PromptThresholds
from tests.unit.test_api_units import STREAM

SLO_HISTOGRAMS = ("ledgerlm_ttft_seconds", "ledgerlm_inter_token_seconds", "ledgerlm_e2e_seconds")


def counts(metrics: ApiMetrics) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(metrics.render()[0].decode()) for s in f.samples
            if s.name.endswith("_count")}


def labels(revision: str, prompt_class: str) -> frozenset:
    return frozenset({("pool", "interactive-normal"), ("revision", revision), ("prompt_class", prompt_class)})


def test_each_generation_is_observed_under_its_prompt_class_and_revision():
    metrics = ApiMetrics(PromptThresholds(short_max_tokens=100, long_min_tokens=1000))
    for input_tokens, revision in ((100, "tiny@1"), (101, "tiny@1"), (999, "tiny@2"), (1000, "tiny@2"),
                                   (5000, "tiny@2")):
        tracker = metrics.track("tenant-a", "interactive-normal", started_at=0.0)
        tracker.describe(revision, input_tokens)
        for event in STREAM:
            tracker.on_event(event)
    found = counts(metrics)
    expected = {("tiny@1", "short"): 1, ("tiny@1", "medium"): 1, ("tiny@2", "medium"): 1, ("tiny@2", "long"): 2}
    for name in SLO_HISTOGRAMS:
        seen = {(dict(k)["revision"], dict(k)["prompt_class"]): v for (n, k), v in found.items()
                if n == f"{name}_count"}
        assert seen == expected, name  # STREAM has two tokens: one TTFT, one gap, one end each
        assert all(set(dict(k)) == {"pool", "revision", "prompt_class"} for (n, k) in found if n == f"{name}_count")


def test_a_generation_never_described_takes_the_revision_its_worker_started_it_at():
    metrics = ApiMetrics()
    tracker = metrics.track("tenant-a", "interactive-normal", started_at=0.0)
    for event in STREAM:  # GenerationStarted says tiny@1
        tracker.on_event(event)
    found = counts(metrics)
    for name in SLO_HISTOGRAMS:
        assert found[(f"{name}_count", labels("tiny@1", "short"))] == 1, name
