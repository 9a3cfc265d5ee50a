"""What a worker says on the fleet topic.

`FleetPresence` is its voice: it says the worker joined, beats its load every interval
from a daemon thread, says when it drains, and that it left. Nothing here may stop the
worker: a failed append is logged and the next beat tries again (a join that failed is
sent again before the next heartbeat, so readers always see a worker's join before its
heartbeats), and `close` gives up after `close_timeout_s`.

`worker_presence` is an interactive worker's presence: its identity from the engine it
loaded, and its load at each heartbeat (queue, slots, KV cache, output rate, the work
partitions it owns). `FleetMembership` is when the worker speaks: it joins once, warm
(its engine looked at first; a worker whose engine is dead never joins), says it drains
when its engine dies, and leaves with the exit code its process ends with; or falls
silent, as a crash would leave it.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from models import topics
from models.events import Envelope, Payload, encode, new_event
from models.events_fleet import Capacity, WorkerDraining, WorkerHeartbeat, WorkerJoined, WorkerLeft
from pipelines.admin.commands import PLATFORM
from pipelines.eventlog import EventLog, Message
from workers.engine import InferenceEngine

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """What a worker serves, from the engine it actually loaded."""

    worker_id: str
    pool: str
    model_revision: str
    engine_config_hash: str
    capacity: Capacity
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)


@dataclass(frozen=True, slots=True)
class Load:
    running: int
    waiting: int
    free_slots: int
    kv_cache_usage: float  # 0..1
    output_tokens_per_s: float
    work_partitions: dict[str, list[int]] | None = None  # work topic -> partitions owned now
    # The engine's KV cache: tokens in use now, and running totals (`workers.engine.KvFigures`).
    kv_tokens_used: int = 0
    preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


class FleetPresence:
    def __init__(self, log: EventLog, identity: WorkerIdentity, load: Callable[[], Load], *,
                 interval_s: float = 1.0, close_timeout_s: float = 5.0):
        self._log, self.identity, self._load = log, identity, load
        self.interval_s = interval_s
        self._close_timeout_s = close_timeout_s
        self._interval_ms = max(1, round(interval_s * 1000))
        self._session = uuid.uuid4().hex  # correlation id of this process's fleet events
        self._seq = 0
        self._joined = False
        self._draining = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sending = threading.Lock()  # one append at a time, so a worker's events stay in order

    def start(self) -> None:
        """Announces the worker and starts beating. Returns even if the join could not be
        appended (the next beat sends it)."""
        if self._thread is not None:
            raise RuntimeError("fleet presence already started")
        self._join()
        self._thread = threading.Thread(target=self._run, name=f"{self.identity.worker_id}-fleet", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

    def beat(self) -> None:
        """One heartbeat now (the thread calls this every interval)."""
        if not self._joined and not self._join():
            return
        try:
            load = self._load()
            heartbeat = WorkerHeartbeat(
                **self._who(), seq=self._seq, draining=self._draining, running=load.running,
                waiting=load.waiting, free_slots=load.free_slots,
                kv_cache_usage=min(1.0, max(0.0, load.kv_cache_usage)),
                output_tokens_per_s=max(0.0, load.output_tokens_per_s), work_partitions=load.work_partitions,
                kv_tokens_used=max(0, load.kv_tokens_used), preemptions=max(0, load.preemptions),
                prefix_cache_queries=max(0, load.prefix_cache_queries),
                prefix_cache_hits=max(0, load.prefix_cache_hits))
        except Exception:
            logger.exception("fleet: %s could not read its load; no heartbeat this time", self.identity.worker_id)
            return
        if self._send(heartbeat):
            self._seq += 1

    def draining(self, reason: str) -> None:
        """Says the worker takes no new work; its heartbeats say so from now on too."""
        self._draining = True
        self._send(WorkerDraining(worker_id=self.identity.worker_id, reason=reason))

    def silence(self) -> None:
        """Stops beating without a word, as a process that died would: readers declare the
        worker lost once its heartbeats are overdue."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._close_timeout_s)

    def close(self, reason: str = "shutdown", exit_code: int | None = None) -> None:
        """Stops beating and says the worker left, giving up after `close_timeout_s`."""
        deadline = time.monotonic() + self._close_timeout_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._close_timeout_s)
        # The leave goes out from a thread of its own, so a log that hangs cannot hold the
        # worker's exit past the timeout.
        leaving = threading.Thread(target=self._send, name=f"{self.identity.worker_id}-fleet-left", daemon=True,
                                   args=(WorkerLeft(worker_id=self.identity.worker_id, reason=reason,
                                                    exit_code=exit_code),))
        leaving.start()
        leaving.join(max(0.0, deadline - time.monotonic()))
        if leaving.is_alive():
            logger.warning("fleet: %s could not say it left within %.1fs", self.identity.worker_id,
                           self._close_timeout_s)

    def _join(self) -> bool:
        self._joined = self._send(WorkerJoined(**self._who()))
        return self._joined

    def _who(self) -> dict:
        i = self.identity
        return dict(worker_id=i.worker_id, pool=i.pool, model_revision=i.model_revision,
                    engine_config_hash=i.engine_config_hash, host=i.host, pid=i.pid, capacity=i.capacity,
                    heartbeat_interval_ms=self._interval_ms)

    def _send(self, payload: Payload) -> bool:
        env: Envelope = new_event(payload, tenant_id=PLATFORM, correlation_id=self._session)
        try:
            with self._sending:
                self._log.append(topics.FLEET.name, [Message(key=self.identity.worker_id, value=encode(env))])
            return True
        except Exception:
            logger.exception("fleet: %s could not append %s; the next beat tries again",
                             self.identity.worker_id, payload.event_type)
            return False


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


class FleetMembership:
    """When a worker speaks on the fleet topic, through `presence` (None: a worker with no
    revision, which says nothing): it joins once, and only while `engine_dead()` is False."""

    def __init__(self, presence: FleetPresence | None, engine_dead: Callable[[], bool]):
        self._presence, self._engine_dead = presence, engine_dead
        self._joined = False

    def join(self) -> None:
        """Announces the worker and starts its heartbeats (once)."""
        if self._presence is not None and not self._joined and not self._engine_dead():
            self._joined = True
            self._presence.start()

    def engine_died(self) -> None:
        """Says the worker drains: it takes no more work."""
        if self._presence is not None and self._joined:
            self._presence.draining("engine_dead")

    def silence(self) -> None:
        """Stops its heartbeats without saying it left (what a crash leaves behind)."""
        if self._presence is not None:
            self._presence.silence()

    def leave(self, engine_dead: bool, exit_code: int) -> None:
        """Stops its heartbeats and says it left: for its dead engine, with `exit_code`."""
        if self._presence is not None and self._joined:
            if engine_dead:
                self._presence.close("engine_dead", exit_code=exit_code)
            else:
                self._presence.close("shutdown")
