"""The interactive pool worker: takes queued generations fairly, runs them on the engine,
and writes what happened to the log.

`InteractiveWorker` is what callers construct; it composes three parts:

- taking (`workers.work_taking`): it reads its pool's work topics ahead into a fair queue
  (deficit round robin by tokens across tenants, high priority first; each worker of a
  pool runs its own over the partitions it owns), starts an item when its tenant may have
  one of the worker's slots (the engine's capacity plus a small take-ahead) and its KV
  claim fits, and commits each take with the item's `GenerationStarted` before any of its
  tokens is written, so a crash leaves untaken work to the next owner and nothing is
  served twice. Queued work cancelled or past its deadline ends there. As the `taker` of
  an admission processor in its process (`offer`), it takes admitted work it can start at
  once in the admission's commit;
- running (`workers.work_running`): taken work runs on the engine runner while its take
  commits, writes nothing until it has, and is aborted if it fails, on `CancelRequested`
  and at its deadline; its events go out through one `StreamWriter`. The engine is
  watched (`workers.engine_watch`), and looked at before the first take;
- announcing (`workers.fleet_presence`): it joins the fleet topic once warm, beats its load,
  says it drains when its engine dies and that it left when it closes.

Once the engine is dead it takes nothing more, its running generations fail (`engine_dead`)
and settle, `run` returns and `close` says on the fleet topic that it left, with the exit
code its process ends with (`exit_code`); what it read ahead but did not take stays
uncommitted.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid

from models import topics
from models.digests import TenantDigests
from models.events import Envelope
from models.topics import Topic
from pipelines.admission.taking import Taking
from pipelines.eventlog import EventLog
from pipelines.outage import Readiness, keep_running
from workers.cancel_watch import CancelWatch
from workers.engine import InferenceEngine
from workers.engine_runner import EngineRunner
from workers.engine_watch import EXIT_ENGINE_DEAD
from workers.fleet_presence import FleetMembership, worker_presence
from workers.queued_work import engine_capacity
from workers.work_running import WorkRunning
from workers.work_taking import WorkTaking, open_work

logger = logging.getLogger(__name__)


class InteractiveWorker:
    """`pool` None is the shared interactive pool; a name serves only that dedicated pool.
    `cancel_log`, a second handle on the same log, is where cancels are followed."""

    IDLE_POSITIONS_S = 1.0  # the longest moved positions wait for a take to commit with (`IdlePositions`)

    def __init__(self, log: EventLog, runner: EngineRunner, engine: InferenceEngine, *,
                 pool: str | None = None, max_in_flight: int | None = None, take_ahead: int | None = 0,
                 worker_id: str | None = None, quantum: int = 256, lookahead: int = 2000,
                 cancel_log: EventLog | None = None, stream_linger_s: float = 0.0,
                 revision: str | None = None, engine_config_hash: str | None = None, heartbeat_s: float = 1.0,
                 health_interval_s: float = 1.0, digests: TenantDigests | None = None, kv_overcommit: float = 1.0):
        self._log, self._runner, self._engine = log, runner, engine
        self.pool = pool or topics.SHARED_POOL
        self.worker_id = worker_id or f"{self.pool}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        # The revision this worker's engine serves: it takes only work pinned to it, from
        # that revision's own work topics, and announces itself on the fleet topic.
        self.revision, self.engine_config_hash = revision, engine_config_hash
        running = max_in_flight or engine_capacity(engine)
        take_ahead = running if take_ahead is None else max(0, take_ahead)
        self.capacity = running + take_ahead
        work_topics, consumer = open_work(log, self.pool, revision, self.worker_id)
        # Its own log handle, where it can: the watch's tail then shares nothing with the
        # worker's reads and appends.
        self._cancels = CancelWatch(cancel_log or log, runner, engine)
        self._cancels.start(name=f"{self.worker_id}-cancels")
        self._running = WorkRunning(log, runner, engine, self._cancels, worker_id=self.worker_id, running=running,
                                    capacity=self.capacity, stream_linger_s=stream_linger_s,
                                    health_interval_s=health_interval_s, digests=digests)
        self._taking = WorkTaking(log, consumer, work_topics, engine, self._cancels, self._running,
                                  worker_id=self.worker_id, revision=revision, engine_config_hash=engine_config_hash,
                                  running=running, take_ahead=take_ahead, quantum=quantum, lookahead=lookahead,
                                  kv_overcommit=kv_overcommit, idle_positions_s=self.IDLE_POSITIONS_S)
        self._fleet = FleetMembership(None if revision is None else worker_presence(
            self, log, revision=revision, engine_config_hash=engine_config_hash or "", running=running,
            interval_s=heartbeat_s), engine_dead=lambda: self.engine_dead)
        self._running.watch.on_dead(self._engine_died)

    @property
    def engine(self) -> InferenceEngine:
        return self._engine

    @property
    def engine_dead(self) -> bool:
        return self._running.engine_dead

    @property
    def engine_death(self) -> str | None:
        """Why its engine was found dead (None while it lives)."""
        return self._running.watch.reason

    @property
    def exit_code(self) -> int:
        """What its process should exit with: non-zero once its engine died, for a
        supervisor to restart it."""
        return EXIT_ENGINE_DEAD if self.engine_dead else 0

    @property
    def output_tokens(self) -> int:
        return self._running.writer.output_tokens

    @property
    def served(self) -> int:
        return self._running.served

    @property
    def in_flight(self) -> int:
        return self._taking.in_flight

    @property
    def queued(self) -> int:
        return self._taking.queued

    def queued_work(self) -> list[Envelope]:
        """The `GenerationQueued` of what it read ahead and has not taken (for metrics, from
        any thread)."""
        return self._taking.queued_work()

    # Its parts' state, as tests and its fleet presence look at it.
    @property
    def _watch(self):
        return self._running.watch

    @property
    def _consumer(self):
        return self._taking.consumer

    @property
    def _assigned(self) -> set | None:
        return self._taking.assigned

    @property
    def _idle(self):
        return self._taking.idle

    def join(self) -> None:
        """Looks at its engine and starts watching it, then announces this worker on the
        fleet topic and starts its heartbeats (once; the first `run_once` does it, so a
        worker is warm before it says it serves). A dead engine never joins."""
        self._running.watch_engine()
        self._fleet.join()

    def _engine_died(self, reason: str) -> None:
        """On the watch's thread: `run_once` takes nothing from now on; the generations
        waiting on the engine end now (`WatchedEngine`), and the fleet hears it drains."""
        logger.error("%s: its engine died (%s); it takes no more work and leaves", self.worker_id, reason)
        self._fleet.engine_died()

    def silence(self) -> None:
        """Stops its heartbeats and its engine watch without saying it left (what a crash
        leaves behind)."""
        self._running.watch.stop()
        self._fleet.silence()

    def run_once(self, timeout_s: float = 0.2) -> int:
        self.join()
        if self.engine_dead:  # it takes nothing more; `run` returns, `close` says why
            time.sleep(timeout_s)
            return 0
        return self._taking.run_once(timeout_s)

    def offer(self, queued: Envelope, work_topic: Topic) -> Taking | None:
        """Admitted work from the admission processor in this process (its `Taker`):
        started now if it can start at once (`WorkTaking.offer`); otherwise None, and it is
        queued as usual."""
        return self._taking.offer(queued, work_topic)

    def run(self, stop: threading.Event, readiness: Readiness | None = None) -> None:
        """Serves until `stop` is set or its engine dies (`exit_code` then says so). A log
        that fails is waited out with backoff (`readiness` down meanwhile); running
        generations go on, and reading starts again from the committed positions."""
        keep_running(self.run_once, stop, readiness=readiness or Readiness("worker"), recover=self.recover,
                     until=lambda: self.engine_dead)

    def recover(self) -> None:
        """After a transient failure anywhere in `run_once`: what was read ahead is
        forgotten; the next look seeks to the committed positions and reads from there."""
        self._taking.recover()

    def close(self, drain_timeout_s: float = 30.0) -> None:
        """Lets running generations finish; queued ones stay uncommitted for the next owner.
        With its engine dead, they have failed already, or fail here (`fail_stranded`)."""
        self._running.drain(lambda: self.in_flight, drain_timeout_s)
        dead = self.engine_dead
        if dead:
            self._running.fail_stranded()
        self._running.watch.stop()
        self._fleet.leave(dead, self.exit_code)
        self._cancels.stop()
        self._taking.consumer.close()
        self._running.io.shutdown(wait=False)
