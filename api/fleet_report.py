"""What `GET /v1/admin/fleet` and `ledgerlm fleet status` show: every worker a fleet view
knows (live, draining, lost, or left while the view still keeps it), with its capacity,
its load as of its last heartbeat (its KV cache's use included) and that heartbeat's age,
and a summary per (pool, revision) of the workers taking work.

Free slots are split in two: `engine_slots_free`, sequences the engine could start now
(its `max_seqs` less those running), and `take_ahead_free`, room left for work a worker
takes ahead of its engine (it waits inside the engine, so a finished sequence is replaced
at the next step; `LEDGERLM_WORKER_TAKE_AHEAD`). `free_slots` is their sum, as before.

A worker is judged lost as admission judges it (`pipelines/admission/lost_workers.py`):
silent for `lost_after_s` (`LEDGERLM_WORKER_LOST_AFTER_S`), never less than three of its
own heartbeat intervals; each worker's row says the silence that applies to it.

KV figures are tokens of the engine's cache, never bytes (the cache's size in memory is
`LEDGERLM_KV_CACHE_GB`, in GiB).

A pure function of the workers and the time: both entrypoints build it the same way.
"""
from __future__ import annotations

from datetime import datetime
from typing import Iterable

from pydantic import BaseModel

from models.fleet import LOST_AFTER_INTERVALS, PoolCapacity, Status, WorkerState, summed

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
    free_slots: int  # engine_slots_free + take_ahead_free
    kv_cache_usage: float  # 0..1
    output_tokens_per_s: float
    kv_tokens_used: int
    preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    engine_slots_free: int = 0  # sequences the engine could start now
    take_ahead_free: int = 0  # room for work taken ahead of the engine, waiting inside it


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
    lost_after_s: float  # lost after this many silent seconds: the setting, or 3 intervals if more
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
    free_slots: int  # engine_slots_free + take_ahead_free
    engine_slots_free: int
    take_ahead_free: int
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
    # The silence after which a worker is lost (`LEDGERLM_WORKER_LOST_AFTER_S`, or `--lost-after`);
    # a worker that beats slowly gets three of its intervals if that is more (see each worker's).
    # None only from a caller that names none: then three intervals apply to each.
    lost_after_s: float | None
    workers: list[WorkerOut]
    pools: list[PoolOut]


def lost_after_for(w: WorkerState, lost_after_s: float | None) -> float:
    """The silence after which `w` is lost, as admission judges it: `lost_after_s`, but never
    less than three of the worker's own heartbeat intervals (None: those three)."""
    own = LOST_AFTER_INTERVALS * w.heartbeat_interval_ms / 1000
    return own if lost_after_s is None else max(lost_after_s, own)


def free_split(free_slots: int, running: int, max_seqs: int) -> tuple[int, int]:
    """A worker's free slots as (engine slots free, take-ahead room free): the engine's
    are its sequences not running, the rest is room for work waiting inside the engine."""
    engine = min(free_slots, max(0, max_seqs - running))
    return engine, free_slots - engine


def worker_out(w: WorkerState, now: datetime, lost_after_s: float | None) -> WorkerOut:
    c = w.capacity
    after = lost_after_for(w, lost_after_s)
    engine_free, ahead_free = free_split(w.free_slots, w.running, c.max_seqs)
    return WorkerOut(
        worker_id=w.worker_id, pool=w.pool, model_revision=w.model_revision, engine_config_hash=w.engine_config_hash,
        host=w.host, pid=w.pid, status=w.status(now, after),
        capacity=CapacityOut(max_seqs=c.max_seqs, kv_cache_tokens=c.kv_cache_tokens, max_model_len=c.max_model_len),
        load=LoadOut(running=w.running, waiting=w.waiting, free_slots=w.free_slots, kv_cache_usage=w.kv_cache_usage,
                     output_tokens_per_s=round(w.output_tokens_per_s, 3), kv_tokens_used=w.kv_tokens_used,
                     preemptions=w.preemptions, prefix_cache_queries=w.prefix_cache_queries,
                     prefix_cache_hits=w.prefix_cache_hits, engine_slots_free=engine_free,
                     take_ahead_free=ahead_free),
        heartbeat_interval_ms=w.heartbeat_interval_ms, lost_after_s=round(after, 3), joined_at=w.joined_at, last_heartbeat_at=w.last_seen,
        last_heartbeat_age_s=round(max(0.0, (now - w.last_seen).total_seconds()), 3),
        drain_reason=w.drain_reason, left_at=w.left_at, left_reason=w.left_reason, exit_code=w.exit_code)


def fleet_report(workers: Iterable[WorkerState], now: datetime, lost_after_s: float | None = None, *,
                 pool: str | None = None, revision: str | None = None) -> FleetOut:
    """The fleet as `workers` (a view's `all()`) stand at `now`, of `pool` and `revision` when given."""
    chosen = sorted((w for w in workers if (pool is None or w.pool == pool)
                     and (revision is None or w.model_revision == revision)),
                    key=lambda w: (w.pool, w.model_revision, w.worker_id))
    shown = [worker_out(w, now, lost_after_s) for w in chosen]
    taking = [(w, out) for w, out in zip(chosen, shown) if out.status == "live"]
    serving = summed(w for w, _ in taking)
    lookups: dict[tuple[str, str], tuple[int, int]] = {}  # prefix-cache queries and hits
    engine_free: dict[tuple[str, str], int] = {}
    for w, out in taking:
        key = (w.pool, w.model_revision)
        queries, hits = lookups.get(key, (0, 0))
        lookups[key] = (queries + w.prefix_cache_queries, hits + w.prefix_cache_hits)
        engine_free[key] = engine_free.get(key, 0) + out.load.engine_slots_free
    counts: dict[tuple[str, str], dict[Status, int]] = {}
    for out in shown:
        per = counts.setdefault((out.pool, out.model_revision), dict.fromkeys(STATUSES, 0))
        per[out.status] += 1
    pools = [_pool_out(key, serving.get(key, PoolCapacity()), lookups.get(key, (0, 0)), engine_free.get(key, 0), per)
             for key, per in sorted(counts.items())]
    return FleetOut(as_of=now, lost_after_s=lost_after_s, workers=shown, pools=pools)


def _pool_out(key: tuple[str, str], c: PoolCapacity, lookups: tuple[int, int], engine_free: int,
              by_status: dict[Status, int]) -> PoolOut:
    return PoolOut(pool=key[0], model_revision=key[1], workers=c.workers, free_slots=c.free_slots,
                   engine_slots_free=engine_free, take_ahead_free=c.free_slots - engine_free,
                   running=c.running, waiting=c.waiting, max_seqs=c.max_seqs, kv_cache_tokens=c.kv_cache_tokens,
                   kv_tokens_used=c.kv_tokens_used, output_tokens_per_s=round(c.output_tokens_per_s, 3),
                   preemptions=c.preemptions, prefix_cache_queries=lookups[0], prefix_cache_hits=lookups[1],
                   by_status=by_status)
