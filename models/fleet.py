"""The fleet as its events say it is: which workers serve which pool and revision, with
what capacity and load, and which went silent.

A pure state machine: `apply` folds one fleet event at the time it happened, and every
query takes `now`, so tests drive it with their own clock. A worker is live while its last
join or heartbeat is younger than `lost_after_s` (by default three of its own heartbeat
intervals) and it has not left; one that went silent without leaving is lost, and stays
reported as such (with its last heartbeat) until `forget` drops it.

Events of one worker arrive in order (one key, one partition). A heartbeat after the
worker left is ignored until it joins again: the publisher sends its join before any
heartbeat of a new process, so only a stray beat of the old one can come after a leave.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Iterable, Literal

from models.events import Payload
from models.events_fleet import Announcement, Capacity, WorkerDraining, WorkerHeartbeat, WorkerJoined, WorkerLeft

Status = Literal["live", "draining", "lost", "left"]
LOST_AFTER_INTERVALS = 3


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One worker as last heard of. Load fields are those of its last heartbeat (zero
    before the first); `last_seen` is the time of its last join or heartbeat."""

    worker_id: str
    pool: str
    model_revision: str
    engine_config_hash: str
    host: str
    pid: int
    capacity: Capacity
    heartbeat_interval_ms: int
    joined_at: datetime | None  # None when only heartbeats were read (a reader that started late)
    last_seen: datetime
    seq: int = -1
    running: int = 0
    waiting: int = 0
    free_slots: int = 0
    kv_cache_usage: float = 0.0
    output_tokens_per_s: float = 0.0
    kv_tokens_used: int = 0
    preemptions: int = 0  # running total since the worker started (see WorkerHeartbeat)
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    draining: bool = False
    drain_reason: str | None = None
    left_at: datetime | None = None
    left_reason: str | None = None
    exit_code: int | None = None
    work_partitions: dict[str, list[int]] | None = None  # of the last heartbeat that said

    def lost_after(self, lost_after_s: float | None) -> timedelta:
        if lost_after_s is None:
            return timedelta(milliseconds=LOST_AFTER_INTERVALS * self.heartbeat_interval_ms)
        return timedelta(seconds=lost_after_s)

    def status(self, now: datetime, lost_after_s: float | None = None) -> Status:
        if self.left_at is not None:
            return "left"
        if now - self.last_seen > self.lost_after(lost_after_s):
            return "lost"
        return "draining" if self.draining else "live"


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """What the workers taking work for one (pool, revision) hold together."""

    workers: int = 0
    max_seqs: int = 0
    kv_cache_tokens: int = 0
    free_slots: int = 0
    running: int = 0
    waiting: int = 0
    output_tokens_per_s: float = 0.0
    kv_tokens_used: int = 0
    preemptions: int = 0

    def plus(self, w: WorkerState) -> "PoolCapacity":
        return PoolCapacity(self.workers + 1, self.max_seqs + w.capacity.max_seqs,
                            self.kv_cache_tokens + w.capacity.kv_cache_tokens, self.free_slots + w.free_slots,
                            self.running + w.running, self.waiting + w.waiting,
                            self.output_tokens_per_s + w.output_tokens_per_s,
                            self.kv_tokens_used + w.kv_tokens_used, self.preemptions + w.preemptions)


class FleetState:
    def __init__(self) -> None:
        self._workers: dict[str, WorkerState] = {}

    # -- folding ----------------------------------------------------------------------

    def apply(self, event: Payload, at: datetime) -> None:
        """Folds one fleet event that happened `at`; other events are ignored."""
        if isinstance(event, WorkerJoined):
            # A join starts a new life of the worker id: nothing of an earlier one carries over.
            self._workers[event.worker_id] = WorkerState(**_announced(event), joined_at=at, last_seen=at)
        elif isinstance(event, WorkerHeartbeat):
            self._beat(event, at)
        elif isinstance(event, WorkerDraining):
            if (w := self._workers.get(event.worker_id)) is not None and w.left_at is None:
                self._workers[w.worker_id] = replace(w, draining=True, drain_reason=event.reason)
        elif isinstance(event, WorkerLeft):
            if (w := self._workers.get(event.worker_id)) is not None and w.left_at is None:
                self._workers[w.worker_id] = replace(w, left_at=at, left_reason=event.reason,
                                                     exit_code=event.exit_code)

    def _beat(self, hb: WorkerHeartbeat, at: datetime) -> None:
        w = self._workers.get(hb.worker_id)
        if w is not None and (w.left_at is not None or hb.seq <= w.seq):
            return  # a stray beat after leaving, or one already folded
        base = w or WorkerState(**_announced(hb), joined_at=None, last_seen=at)
        self._workers[hb.worker_id] = replace(
            base, **_announced(hb), last_seen=max(base.last_seen, at), seq=hb.seq, running=hb.running,
            waiting=hb.waiting, free_slots=hb.free_slots, kv_cache_usage=hb.kv_cache_usage,
            output_tokens_per_s=hb.output_tokens_per_s, kv_tokens_used=hb.kv_tokens_used,
            preemptions=hb.preemptions, prefix_cache_queries=hb.prefix_cache_queries,
            prefix_cache_hits=hb.prefix_cache_hits, draining=base.draining or hb.draining,
            work_partitions=hb.work_partitions)

    def forget(self, before: datetime) -> int:
        """Drops workers that left or went silent before `before` (bounds memory); returns how many."""
        gone = [w.worker_id for w in self._workers.values() if (w.left_at or w.last_seen) < before]
        for worker_id in gone:
            del self._workers[worker_id]
        return len(gone)

    # -- queries ----------------------------------------------------------------------

    def worker(self, worker_id: str) -> WorkerState | None:
        return self._workers.get(worker_id)

    def all(self) -> list[WorkerState]:
        """Every worker known, whatever its status, by id."""
        return sorted(self._workers.values(), key=lambda w: w.worker_id)

    def live(self, now: datetime, lost_after_s: float | None = None) -> list[WorkerState]:
        """Workers heard from within `lost_after_s` that have not left (draining ones included)."""
        return [w for w in self.all() if w.status(now, lost_after_s) in ("live", "draining")]

    def lost(self, now: datetime, lost_after_s: float | None = None) -> list[WorkerState]:
        """Workers that went silent without leaving; `last_seen` says when they were last heard."""
        return [w for w in self.all() if w.status(now, lost_after_s) == "lost"]

    def serving(self, now: datetime, lost_after_s: float | None = None, *, pool: str | None = None,
                revision: str | None = None) -> list[WorkerState]:
        """Live workers taking new work (not draining), of `pool` and `revision` when given."""
        return [w for w in self.all() if w.status(now, lost_after_s) == "live"
                and (pool is None or w.pool == pool) and (revision is None or w.model_revision == revision)]

    def serves(self, pool: str, revision: str, now: datetime, lost_after_s: float | None = None) -> bool:
        return bool(self.serving(now, lost_after_s, pool=pool, revision=revision))

    def capacity(self, now: datetime, lost_after_s: float | None = None) -> dict[tuple[str, str], PoolCapacity]:
        """Capacity and load summed per (pool, revision) over the workers taking work."""
        return summed(self.serving(now, lost_after_s))

    def revisions(self, now: datetime, lost_after_s: float | None = None, *, pool: str | None = None) -> set[str]:
        """Revisions some live worker (of `pool`, when given) takes work for now."""
        return {w.model_revision for w in self.serving(now, lost_after_s, pool=pool)}


def _announced(event: Announcement) -> dict:
    # Attributes, not model_dump: the capacity stays a Capacity.
    return {name: getattr(event, name) for name in Announcement.model_fields}


def summed(workers: Iterable[WorkerState]) -> dict[tuple[str, str], PoolCapacity]:
    out: dict[tuple[str, str], PoolCapacity] = {}
    for w in workers:
        key = (w.pool, w.model_revision)
        out[key] = out.get(key, PoolCapacity()).plus(w)
    return out
