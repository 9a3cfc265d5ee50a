"""What an interactive worker tells the fleet: its identity from the engine it loaded,
and its load at each heartbeat (`workers.fleet_presence` sends them)."""
from __future__ import annotations

import time
from typing import Callable

from models.events_fleet import Capacity
from workers.engine import InferenceEngine
from workers.fleet_presence import FleetPresence, Load, WorkerIdentity


def engine_capacity_of(engine: InferenceEngine, running: int) -> Capacity:
    """What the worker's engine holds: the sequences the worker runs at once, the KV-cache
    tokens the engine allocated (0: it does not say), and its context length (1 for an
    engine with no limit of its own, which a stand-in is)."""
    return Capacity(max_seqs=max(1, running), kv_cache_tokens=max(0, engine.kv_figures().capacity_tokens),
                    max_model_len=max(1, engine.max_model_len() or 1))


class TokenRate:
    """Output tokens per second between two readings of a growing counter."""

    def __init__(self, count: Callable[[], int]):
        self._count = count
        self._last = (time.monotonic(), count())

    def __call__(self) -> float:
        now, total = time.monotonic(), self._count()
        then, before = self._last
        self._last = (now, total)
        return (total - before) / (now - then) if now > then else 0.0


def owned_work(assigned) -> dict[str, list[int]] | None:
    """The work topics' partitions in a consumer assignment, by topic; None before any."""
    if not assigned:
        return None
    owned: dict[str, list[int]] = {}
    for topic, partition in assigned:
        owned.setdefault(topic, []).append(partition)
    return {t: sorted(ps) for t, ps in sorted(owned.items())}


def worker_presence(worker, log, *, revision: str, engine_config_hash: str, running: int,
                    interval_s: float) -> FleetPresence:
    """A presence for `worker` (an `InteractiveWorker`), beating its queue and slots."""
    rate = TokenRate(lambda: worker.output_tokens)
    identity = WorkerIdentity(worker_id=worker.worker_id, pool=worker.pool, model_revision=revision,
                              engine_config_hash=engine_config_hash,
                              capacity=engine_capacity_of(worker.engine, running))

    def load() -> Load:
        in_flight, kv = worker.in_flight, worker.engine.kv_figures()
        return Load(running=min(in_flight, running), waiting=worker.queued + max(0, in_flight - running),
                    free_slots=max(0, worker.capacity - in_flight), kv_cache_usage=kv.usage,
                    output_tokens_per_s=rate(), work_partitions=owned_work(worker._assigned),
                    kv_tokens_used=kv.used_tokens, preemptions=kv.preemptions,
                    prefix_cache_queries=kv.prefix_cache_queries, prefix_cache_hits=kv.prefix_cache_hits)
    return FleetPresence(log, identity, load, interval_s=interval_s)
