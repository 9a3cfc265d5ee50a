"""Prometheus metrics of one API process, as its clients see their generations.

Labels are pools, revisions, prompt classes, tenants, decisions and reasons: never text,
ids or prompts. Each app has its own registry (no module globals), so several apps can live
in one process. Latencies are measured here, at the API, from the moment a request arrived:
what a client experiences, log and queue included. Queue time is the worker's measurement.
TTFT, inter-token and end-to-end times are per pool, revision and prompt class
(`models.prompt_class`), so an objective can be judged per class and per revision.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from api.stream_hub import StreamEvent
from models.events_generation import (
    GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationRejected, GenerationStarted,
    TokensEmitted,
)
from models.prompt_class import PromptThresholds

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_GAP = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# The labels of the latency histograms an objective is judged on; Prometheus rules name them.
SLO_LABELS = ("pool", "revision", "prompt_class")


class ApiMetrics:
    def __init__(self, prompt_thresholds: PromptThresholds | None = None) -> None:
        r = self.registry = CollectorRegistry()
        self.prompt_thresholds = prompt_thresholds or PromptThresholds()
        self.ttft = Histogram("ledgerlm_ttft_seconds",
                              "Request arrival to its first output token, per pool, revision and prompt class",
                              SLO_LABELS, buckets=_LATENCY, registry=r)
        self.inter_token = Histogram("ledgerlm_inter_token_seconds",
                                     "Time between output tokens, per pool, revision and prompt class",
                                     SLO_LABELS, buckets=_TOKEN_GAP, registry=r)
        self.queue_time = Histogram("ledgerlm_queue_seconds", "Admission to a worker starting it, per pool",
                                    ["pool"], buckets=_LATENCY, registry=r)
        self.e2e = Histogram("ledgerlm_e2e_seconds", "Request arrival to its end event, per pool, revision and "
                             "prompt class", SLO_LABELS, buckets=_LATENCY, registry=r)
        self.decisions = Counter("ledgerlm_admission_decisions", "Generations admitted or rejected, by reason",
                                 ["decision", "reason"], registry=r)
        self.in_flight = Gauge("ledgerlm_in_flight_requests", "Generations this API is waiting on, per tenant",
                               ["tenant"], registry=r)
        self.tokens = Counter("ledgerlm_tokens", "Tokens of ended generations, per tenant and kind",
                              ["tenant", "kind"], registry=r)
        self.client_gone = Counter("ledgerlm_client_gone", "Streams cancelled because their client went away",
                                   registry=r)
        self.fleet = None  # the API's FleetView (api.deps sets it): read at scrape time
        self.cache = None  # the API's AnswerCache (api.deps sets it): read at scrape time
        r.register(_FleetCollector(self))
        r.register(_CacheCollector(self))

    def track(self, tenant_id: str, pool: str, started_at: float) -> "Tracker":
        return Tracker(self, tenant_id, pool, started_at)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _FleetCollector(Collector):
    """The fleet as this API sees it (its FleetView, refreshed in the background), per pool
    and revision: workers live (draining ones included) and lost, and what the workers
    taking work hold free, run and keep waiting, and the KV cache their engines allocated
    and hold in use, as their last heartbeats said."""

    def __init__(self, metrics: ApiMetrics):
        self._metrics = metrics

    def collect(self):
        fleet = self._metrics.fleet
        if fleet is None:
            return []
        labels = ["pool", "revision"]
        families = {name: GaugeMetricFamily(name, help_text, labels=labels) for name, help_text in (
            ("ledgerlm_fleet_live_workers", "Workers heard from and not left, draining ones included"),
            ("ledgerlm_fleet_lost_workers", "Workers gone silent without leaving"),
            ("ledgerlm_fleet_serving_workers", "Live workers taking new work"),
            ("ledgerlm_fleet_free_slots", "Free slots of the workers taking work, at their last heartbeat"),
            ("ledgerlm_fleet_running", "Generations the workers taking work run, at their last heartbeat"),
            ("ledgerlm_fleet_waiting", "Work the workers taking work hold queued, at their last heartbeat"),
            ("ledgerlm_fleet_kv_cache_tokens", "KV-cache tokens the engines of the workers taking work allocated"),
            ("ledgerlm_fleet_kv_cache_used_tokens",
             "KV-cache tokens in use on the workers taking work, at their last heartbeat"),
        )}
        for name, workers in (("ledgerlm_fleet_live_workers", fleet.live()), ("ledgerlm_fleet_lost_workers",
                                                                              fleet.lost())):
            counts: dict[tuple[str, str], int] = {}
            for w in workers:
                counts[(w.pool, w.model_revision)] = counts.get((w.pool, w.model_revision), 0) + 1
            for key, count in counts.items():
                families[name].add_metric(list(key), count)
        for key, capacity in fleet.capacity().items():
            families["ledgerlm_fleet_serving_workers"].add_metric(list(key), capacity.workers)
            families["ledgerlm_fleet_free_slots"].add_metric(list(key), capacity.free_slots)
            families["ledgerlm_fleet_running"].add_metric(list(key), capacity.running)
            families["ledgerlm_fleet_waiting"].add_metric(list(key), capacity.waiting)
            families["ledgerlm_fleet_kv_cache_tokens"].add_metric(list(key), capacity.kv_cache_tokens)
            families["ledgerlm_fleet_kv_cache_used_tokens"].add_metric(list(key), capacity.kv_tokens_used)
        return list(families.values())


class _CacheCollector(Collector):
    """The semantic cache's lookups per tenant and alias: hits, misses, and how near the
    nearest entry of a miss was (a histogram of similarity), so a tenant's threshold can be
    judged from how many misses fell just short of it."""

    def __init__(self, metrics: ApiMetrics):
        self._metrics = metrics

    def collect(self):
        from pipelines.cache.semantic import NEAR_MISS_BUCKETS

        cache = self._metrics.cache
        if cache is None:
            return []
        labels = ["tenant", "alias"]
        lookups = CounterMetricFamily("ledgerlm_cache_lookups", "Semantic cache lookups, by outcome",
                                      labels=[*labels, "outcome"])
        near = HistogramMetricFamily("ledgerlm_cache_near_miss_similarity",
                                     "Similarity of the nearest live entry, on misses that had one", labels=labels)
        for (tenant, alias), counts in sorted(cache.counts.items()):
            lookups.add_metric([tenant, alias, "hit"], counts.hits)
            lookups.add_metric([tenant, alias, "miss"], counts.misses)
            running, buckets = 0, []
            for top, count in zip(NEAR_MISS_BUCKETS, counts.near_misses):
                running += count
                buckets.append((str(top), running))
            buckets[-1] = ("+Inf", running)
            near.add_metric([tenant, alias], buckets, None)
        return [lookups, near]


class Tracker:
    """Follows one live generation's events; `started_at` is `time.monotonic()` at arrival.
    `describe` names its revision and prompt length once they are known (after submission,
    before any event is read); until then its revision is what `GenerationStarted` says and
    its prompt counts as empty."""

    def __init__(self, metrics: ApiMetrics, tenant_id: str, pool: str, started_at: float):
        self._m, self._tenant, self._pool, self._t0 = metrics, tenant_id, pool, started_at
        self._decided = False
        self._last_token: float | None = None
        self._open = True
        self._revision, self._input_tokens = "", 0
        self._labels: tuple[str, str, str] | None = None  # fixed at the first observation that needs them
        self._inter_token = None  # looked up once: every token observes it
        metrics.in_flight.labels(tenant_id).inc()

    def describe(self, revision: str, input_tokens: int) -> None:
        self._revision, self._input_tokens = revision, input_tokens

    def _slo_labels(self) -> tuple[str, str, str]:
        if self._labels is None:
            cls = self._m.prompt_thresholds.classify(self._input_tokens)
            self._labels = (self._pool, self._revision, cls)
            self._inter_token = self._m.inter_token.labels(*self._labels)
        return self._labels

    def on_event(self, event: StreamEvent) -> None:
        p, now, m = event.env.payload, time.monotonic(), self._m
        if not self._decided:
            self._decided = True
            rejected = isinstance(p, GenerationRejected)
            m.decisions.labels("rejected" if rejected else "admitted", p.reason if rejected else "").inc()
        if isinstance(p, GenerationStarted):
            self._revision = self._revision or p.model_revision
            m.queue_time.labels(self._pool).observe(p.queued_ms / 1000)
        elif isinstance(p, TokensEmitted) and p.token_count:
            labels = self._slo_labels()
            observe = self._inter_token.observe
            if self._last_token is None:
                m.ttft.labels(*labels).observe(now - self._t0)
                for _ in range(p.token_count - 1):  # the first event's later tokens came with the first
                    observe(0.0)
            else:
                gap = (now - self._last_token) / p.token_count  # deltas merged into one event share the gap
                for _ in range(p.token_count):
                    observe(gap)
            self._last_token = now
        elif isinstance(p, (GenerationCompleted, GenerationFailed, GenerationCancelled)):
            m.e2e.labels(*self._slo_labels()).observe(now - self._t0)
            m.tokens.labels(self._tenant, "input").inc(p.input_tokens)
            m.tokens.labels(self._tenant, "output").inc(p.output_tokens)
            self.close()
        elif isinstance(p, GenerationRejected):
            self.close()

    def close(self) -> None:
        if self._open:
            self._open = False
            self._m.in_flight.labels(self._tenant).dec()
