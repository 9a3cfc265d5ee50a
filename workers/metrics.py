"""Prometheus metrics of an interactive pool worker, read from it at scrape time.

What it has read ahead and not taken (queue depth and the oldest one's age, by pool,
revision and priority), what it runs, its free slots and the output tokens it wrote; its
engine's KV cache in tokens, allocated and in use, where the engine says (`kv_figures` of
the engine port); and what its vLLM engine says of itself (KV-cache usage, preemptions,
prefix-cache lookups, step times) where the engine keeps `EngineStats` (the port's `stats`,
`workers.engine_stats`; a fake engine has none, and those series are then absent).
Served by `pipelines.metrics.serve_metrics`, one worker a process.
"""
from __future__ import annotations

from datetime import datetime, timezone

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from workers.engine_stats import STEP_BUCKETS_S, EngineStats
from workers.fair_share import PRIORITIES


class WorkerCollector(Collector):
    def __init__(self, worker):
        self._worker = worker

    def collect(self):
        w = self._worker
        pool, revision = w.pool, w.revision or ""
        labels, values = ["pool", "revision"], [pool, revision]
        depth = GaugeMetricFamily("ledgerlm_worker_queued", "Work read ahead and not taken yet, by priority",
                                  labels=[*labels, "priority"])
        oldest = GaugeMetricFamily("ledgerlm_worker_oldest_queued_seconds",
                                   "Age of the oldest work read ahead and not taken (0: none), by priority",
                                   labels=[*labels, "priority"])
        now = datetime.now(timezone.utc)
        by_priority: dict[str, list[datetime]] = {p: [] for p in PRIORITIES}
        for queued in w.queued_work():
            by_priority.setdefault(queued.payload.request.priority, []).append(queued.payload.queued_at)
        for priority, times in by_priority.items():
            depth.add_metric([*values, priority], len(times))
            oldest.add_metric([*values, priority], max(0.0, (now - min(times)).total_seconds()) if times else 0.0)
        yield depth
        yield oldest
        running = w.in_flight
        yield _gauge("ledgerlm_worker_running", "Generations taken and not ended", labels, values, running)
        yield _gauge("ledgerlm_worker_free_slots", "Slots free for work (the engine's and the take-ahead)",
                     labels, values, max(0, w.capacity - running))
        tokens = CounterMetricFamily("ledgerlm_worker_output_tokens", "Output tokens this worker wrote",
                                     labels=labels)
        tokens.add_metric(values, w.output_tokens)
        yield tokens
        kv = w.engine.kv_figures()
        if kv.capacity_tokens:
            yield _gauge("ledgerlm_engine_kv_cache_tokens", "KV-cache tokens the engine allocated",
                         labels, values, kv.capacity_tokens)
            yield _gauge("ledgerlm_engine_kv_cache_used_tokens",
                         "KV-cache tokens running requests hold (whole blocks)", labels, values, kv.used_tokens)
        stats = w.engine.stats
        if stats is not None:
            yield from _engine(stats, labels, values)


def _gauge(name: str, help_text: str, labels: list[str], values: list[str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=labels)
    family.add_metric(values, value)
    return family


def _engine(stats: EngineStats, labels: list[str], values: list[str]):
    yield _gauge("ledgerlm_engine_kv_cache_usage", "Fraction of the engine's KV cache in use (vLLM), 0..1",
                 labels, values, stats.kv_cache_usage)
    yield _gauge("ledgerlm_engine_waiting", "Requests waiting inside the engine (vLLM's scheduler)",
                 labels, values, stats.waiting)
    preemptions = CounterMetricFamily("ledgerlm_engine_preemptions", "Sequences the engine preempted (vLLM)",
                                      labels=labels)
    preemptions.add_metric(values, stats.preemptions)
    yield preemptions
    for name, help_text, total in (
            ("ledgerlm_engine_prefix_cache_queries", "Prompt tokens looked up in the prefix cache (vLLM)",
             stats.prefix_cache_queries),
            ("ledgerlm_engine_prefix_cache_hits", "Prompt tokens found in the prefix cache (vLLM)",
             stats.prefix_cache_hits)):
        family = CounterMetricFamily(name, help_text, labels=labels)
        family.add_metric(values, total)
        yield family
    steps = HistogramMetricFamily("ledgerlm_engine_step_seconds", "Time of one engine step (vLLM)", labels=labels)
    cumulative, buckets = 0, []
    for bound, count in zip([*map(str, STEP_BUCKETS_S), "+Inf"], list(stats.step_counts)):
        cumulative += count
        buckets.append((bound, cumulative))
    steps.add_metric(values, buckets, sum_value=stats.step_sum_s)
    yield steps


def worker_metrics(worker) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(WorkerCollector(worker))
    return registry
