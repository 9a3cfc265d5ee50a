"""What `GET /v1/admin/fleet` and `ledgerlm fleet status` show: every worker a fleet view
knows (live, draining, lost, or left while the view still keeps it), with its capacity,
its load as of its last heartbeat (its KV cache's use included) and that heartbeat's age,
and a summary per (pool, revision) of the workers taking work.

A pure function of the workers and the time: both entrypoints build it the same way.
"""
from __future__ import annotations

from datetime import datetime
from typing import Iterable

from pydantic import BaseModel

from models.fleet import PoolCapacity, Status, WorkerState, summed

STATUSES: tuple[Status, ...] = ("live", "draining", "lost", "left")


class CapacityOut(BaseModel):
    max_seqs: int
    kv_cache_tokens: int
    max_model_len: int


class LoadOut(BaseModel):
    """As of the worker's last heartbeat (zero before its first). KV tokens in use are whole
    blocks of the engine's cache; preemptions and prefix-cache lookups (prompt tokens looked
    up, and found) are running totals since the worker started. Zero from engines that do
    not say."""

    running: int
    waiting: int
    free_slots: int
    kv_cache_usage: float  # 0..1
    output_tokens_per_s: float
    kv_tokens_used: int
    preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int


class WorkerOut(BaseModel):
    worker_id: str
    pool: str
    model_revision: str
    engine_config_hash: str
    host: str
    pid: int
    status: Status
    capacity: CapacityOut
    load: LoadOut
    heartbeat_interval_ms: int
    joined_at: datetime | None  # None when the reader started after the join
    last_heartbeat_at: datetime
    last_heartbeat_age_s: float
    drain_reason: str | None = None
    left_at: datetime | None = None
    left_reason: str | None = None
    exit_code: int | None = None


class PoolOut(BaseModel):
    """One (pool, revision): capacity and load summed over the workers taking work (live,
    not draining), and how many workers it has in each status."""

    pool: str
    model_revision: str
    workers: int
    free_slots: int
    running: int
    waiting: int
    max_seqs: int
    kv_cache_tokens: int
    kv_tokens_used: int
    output_tokens_per_s: float
    preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    by_status: dict[Status, int]


class FleetOut(BaseModel):
    as_of: datetime
    lost_after_s: float | None  # None: three of each worker's own heartbeat intervals
    workers: list[WorkerOut]
    pools: list[PoolOut]


def worker_out(w: WorkerState, now: datetime, lost_after_s: float | None) -> WorkerOut:
    c = w.capacity
    return WorkerOut(
        worker_id=w.worker_id, pool=w.pool, model_revision=w.model_revision, engine_config_hash=w.engine_config_hash,
        host=w.host, pid=w.pid, status=w.status(now, lost_after_s),
        capacity=CapacityOut(max_seqs=c.max_seqs, kv_cache_tokens=c.kv_cache_tokens, max_model_len=c.max_model_len),
        load=LoadOut(running=w.running, waiting=w.waiting, free_slots=w.free_slots, kv_cache_usage=w.kv_cache_usage,
                     output_tokens_per_s=round(w.output_tokens_per_s, 3), kv_tokens_used=w.kv_tokens_used,
                     preemptions=w.preemptions, prefix_cache_queries=w.prefix_cache_queries,
                     prefix_cache_hits=w.prefix_cache_hits),
        heartbeat_interval_ms=w.heartbeat_interval_ms, joined_at=w.joined_at, last_heartbeat_at=w.last_seen,
        last_heartbeat_age_s=round(max(0.0, (now - w.last_seen).total_seconds()), 3),
        drain_reason=w.drain_reason, left_at=w.left_at, left_reason=w.left_reason, exit_code=w.exit_code)


def fleet_report(workers: Iterable[WorkerState], now: datetime, lost_after_s: float | None = None, *,
                 pool: str | None = None, revision: str | None = None) -> FleetOut:
    """The fleet as `workers` (a view's `all()`) stand at `now`, of `pool` and `revision` when given."""
    chosen = sorted((w for w in workers if (pool is None or w.pool == pool)
                     and (revision is None or w.model_revision == revision)),
                    key=lambda w: (w.pool, w.model_revision, w.worker_id))
    shown = [worker_out(w, now, lost_after_s) for w in chosen]
    taking = [w for w, out in zip(chosen, shown) if out.status == "live"]
    serving = summed(taking)
    lookups: dict[tuple[str, str], tuple[int, int]] = {}  # prefix-cache queries and hits
    for w in taking:
        queries, hits = lookups.get((w.pool, w.model_revision), (0, 0))
        lookups[(w.pool, w.model_revision)] = (queries + w.prefix_cache_queries, hits + w.prefix_cache_hits)
    counts: dict[tuple[str, str], dict[Status, int]] = {}
    for out in shown:
        per = counts.setdefault((out.pool, out.model_revision), dict.fromkeys(STATUSES, 0))
        per[out.status] += 1
    pools = [_pool_out(key, serving.get(key, PoolCapacity()), lookups.get(key, (0, 0)), per)
             for key, per in sorted(counts.items())]
    return FleetOut(as_of=now, lost_after_s=lost_after_s, workers=shown, pools=pools)


def _pool_out(key: tuple[str, str], c: PoolCapacity, lookups: tuple[int, int],
              by_status: dict[Status, int]) -> PoolOut:
    return PoolOut(pool=key[0], model_revision=key[1], workers=c.workers, free_slots=c.free_slots,
                   running=c.running, waiting=c.waiting, max_seqs=c.max_seqs, kv_cache_tokens=c.kv_cache_tokens,
                   kv_tokens_used=c.kv_tokens_used, output_tokens_per_s=round(c.output_tokens_per_s, 3),
                   preemptions=c.preemptions, prefix_cache_queries=lookups[0], prefix_cache_hits=lookups[1],
                   by_status=by_status)
