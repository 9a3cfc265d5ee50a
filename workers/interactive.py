"""The interactive pool worker: takes queued generations fairly, runs them on the engine,
and writes what happened to the log.

It reads its pool's work topics ahead into a `FairQueue` (deficit round robin by tokens
across tenants, high priority first) and starts an item when `Headroom` gives its tenant
one of the worker's slots: the engine's capacity (max_num_seqs) plus a small take-ahead
(`take_ahead`; None: the capacity again) waiting inside the engine, so a sequence that
ends is replaced at the engine's next step, not after a round trip through the log. A
tenant over its fair share gets the take-ahead (and the last engine slot) only while no
other tenant is active, and what waits inside the engine is ordered by priority class,
then by its tenant's generations in flight. Taking is committed with the item's
`GenerationStarted` before any of its tokens is written, up to the first item not yet
taken (`workers.work_positions`), so a crash leaves untaken work to the next owner and
nothing is served twice. The engine starts while the take commits; a failed commit aborts
the generation unwritten. Queued work cancelled or past its deadline ends there; running
work is aborted on `CancelRequested` and at its deadline. Token and terminal events go out
through one `StreamWriter`, batched across generations, so a slow log never slows the engine.

Fair share at the pool level. A revision's work topics are keyed by request
(`models.topics`), so each worker owns a share of the partitions and receives about that
share of every tenant's work: each runs its own deficit round robin over a sample of the
pool's queue, and the pool's split between tenants approximates the weighted fair share.
No tenant is tied to one worker, a flooding tenant uses the whole pool while alone, a light
tenant is served within the fair share of whichever worker it lands on, and a failed
worker's partitions spread over all survivors. Nothing coordinates the workers, so
fairness is exact only in expectation; nothing is stolen (one worker may queue while
another idles); and a tenant's requests start in no set order across workers.

An item also starts only while its KV claim fits beside those of what the worker runs,
within its engine's KV cache times `kv_overcommit` (`workers.kv_gate`).

A worker can also be the `taker` of an admission processor in its process (`offer`):
admitted work it can start at once is taken in the admission's commit and never queued.

It watches its engine (`workers.engine_watch`), and looks before its first take. Once the
engine is dead it takes nothing more, its running generations fail (`engine_dead`) and
settle, `run` returns and `close` says on the fleet topic that it left, with the exit code
its process ends with (`exit_code`); what it read ahead but did not take stays uncommitted.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import datetime, timezone

from models import topics
from models.digests import TenantDigests
from models.events import Envelope, EventDecodeError, caused_by, decode
from models.events_generation import (
    GenerationCancelled, GenerationFailed, GenerationQueued, GenerationStarted, Timings,
)
from models.topics import Topic
from pipelines.admission.processor import Taking
from pipelines.eventlog import EventLog, EventLogError, Fenced, Message, Record, TopicSpec
from pipelines.idle_positions import IdlePositions
from pipelines.outage import Readiness, keep_running
from pipelines.publish import beside, publish, to_outputs
from workers.cancel_watch import CancelWatch
from workers.engine import InferenceEngine
from workers.engine_runner import EngineRunner
from workers.engine_watch import EXIT_ENGINE_DEAD, EngineWatch, WatchedEngine
from workers.fair_share import FairQueue, Headroom, Item
from workers.generation import PRIORITY, fetch_prompt, serve_generation
from workers.kv_gate import KvGate
from workers.queued_work import QueuedWork, WorkItem, engine_capacity
from workers.stream_writer import StreamWriter
from workers.work_positions import WorkPositions
from workers.fleet_presence import worker_presence

logger = logging.getLogger(__name__)
Writes = list[tuple[str, Message]]  # what one take commits: (topic name, message)


def _ms_since(start: datetime, now: datetime) -> int:
    return max(0, int((now - start).total_seconds() * 1000))


class InteractiveWorker:
    """`pool` None is the shared interactive pool; a name serves only that dedicated pool.
    `cancel_log`, a second handle on the same log, is where cancels are followed."""

    SWEEP_S = 0.25  # how often queued work is checked for cancels and passed deadlines
    # With work queued, how long one look for new work may wait: new work ends it at once,
    # a freed slot is seen at the next look. Shorter costs more than it gains on Kafka,
    # where every look is a round of the client's protocol work in Python.
    QUEUED_WAIT_S = 0.01
    ABANDON_WAIT_S = 10.0  # the most a failed take waits for its generations to leave the engine
    IDLE_POSITIONS_S = 1.0  # the longest moved positions wait for a take to commit with (`IdlePositions`)
    DEAD_DRAIN_S = 5.0  # the most `close` waits for generations of a dead engine to end on their own

    def __init__(self, log: EventLog, runner: EngineRunner, engine: InferenceEngine, *,
                 pool: str | None = None, max_in_flight: int | None = None, take_ahead: int | None = 0,
                 worker_id: str | None = None, quantum: int = 256, lookahead: int = 2000,
                 cancel_log: EventLog | None = None, stream_linger_s: float = 0.0,
                 revision: str | None = None, engine_config_hash: str | None = None, heartbeat_s: float = 1.0,
                 health_interval_s: float = 1.0, digests: TenantDigests | None = None, kv_overcommit: float = 1.0):
        self._log, self._runner, self._engine = log, runner, engine
        self._digests = digests  # keys output digests per tenant (the settings' digest_key)
        # Generations run on the watched engine: once it is found dead, they end at once.
        self._watch = EngineWatch(runner, engine, interval_s=health_interval_s)
        self._serving_engine = WatchedEngine(engine, self._watch, runner)
        self._watching = False
        self._serving: dict[str, tuple[Envelope, Future]] = {}  # running generations: start, take
        self.pool = pool or topics.SHARED_POOL
        self.worker_id = worker_id or f"{self.pool}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        # The revision this worker's engine serves: it takes only work pinned to it, from
        # that revision's own work topics, and announces itself on the fleet topic.
        self.revision, self.engine_config_hash = revision, engine_config_hash
        running = max_in_flight or engine_capacity(engine)
        take_ahead = running if take_ahead is None else max(0, take_ahead)
        self.capacity = running + take_ahead
        self._topics = {t.name: t for t in topics.pool_work_topics(pool, revision)}
        log.ensure_topics([TopicSpec(t.name, t.partitions, t.retention_ms) for t in self._topics.values()])
        self._consumer = log.consumer(topics.work_group(self.pool, revision), sorted(self._topics),
                                      member_id=self.worker_id)
        # Its own log handle, where it can: the watch's tail then shares nothing with the
        # worker's reads and appends.
        self._cancels = CancelWatch(cancel_log or log, runner, engine)
        self._cancels.start(name=f"{self.worker_id}-cancels")
        self._lookahead = lookahead
        self._quantum = quantum
        self._slots = Headroom(running, take_ahead=take_ahead)
        self._kv = KvGate.of_engine(engine, running, kv_overcommit, queued=lambda request_id: request_id in self._items)
        self._io = ThreadPoolExecutor(self.capacity + 2, thread_name_prefix=f"{self.worker_id}-io")
        self._writer = StreamWriter(log, self._io, linger_s=stream_linger_s, full_at=running)
        self._slots_lock = threading.Lock()
        self._assigned: set | None = None
        self._reset(set())
        self._next_sweep = 0.0
        self.served = 0
        self._presence = None if revision is None else worker_presence(
            self, log, revision=revision, engine_config_hash=engine_config_hash or "", running=running,
            interval_s=heartbeat_s)
        self._joined = False
        self._watch.on_dead(self._engine_died)

    @property
    def engine(self) -> InferenceEngine:
        return self._engine

    @property
    def engine_dead(self) -> bool:
        return self._watch.dead

    @property
    def engine_death(self) -> str | None:
        """Why its engine was found dead (None while it lives)."""
        return self._watch.reason

    @property
    def exit_code(self) -> int:
        """What its process should exit with: non-zero once its engine died, for a
        supervisor to restart it."""
        return EXIT_ENGINE_DEAD if self.engine_dead else 0

    @property
    def output_tokens(self) -> int:
        return self._writer.output_tokens

    def join(self) -> None:
        """Looks at its engine and starts watching it, then announces this worker on the
        fleet topic and starts its heartbeats (once; the first `run_once` does it, so a
        worker is warm before it says it serves). A dead engine never joins."""
        if not self._watching:
            self._watching = True
            if self._watch.check():
                self._watch.start(name=f"{self.worker_id}-engine-watch")
        if self._presence is not None and not self._joined and not self.engine_dead:
            self._joined = True
            self._presence.start()

    def _engine_died(self, reason: str) -> None:
        """On the watch's thread: `run_once` takes nothing from now on; the generations
        waiting on the engine end now (`WatchedEngine`), and the fleet hears it drains."""
        logger.error("%s: its engine died (%s); it takes no more work and leaves", self.worker_id, reason)
        if self._presence is not None and self._joined:
            self._presence.draining("engine_dead")

    def _reset(self, assigned: set) -> None:
        """Forgets everything read ahead; reading restarts at the committed positions."""
        self._queue: FairQueue[QueuedWork] = FairQueue(quantum=self._quantum)
        self._items: dict[str, WorkItem] = {}  # queued items by request id
        self._positions = WorkPositions.at_assignment(self._log, self._consumer, assigned)
        self._committed = self._positions.commit_offsets()
        self._idle = IdlePositions(self.IDLE_POSITIONS_S)
        self._assigned = assigned

    @property
    def in_flight(self) -> int:
        with self._slots_lock:
            return self.capacity - self._slots.free

    @property
    def queued(self) -> int:
        return len(self._queue)

    def queued_work(self) -> list[Envelope]:
        """The `GenerationQueued` of what it read ahead and has not taken (for metrics, from
        any thread: one copy of the dict, which the worker's thread changes meanwhile)."""
        return [item.value.queued for item in list(self._items.values())]

    def silence(self) -> None:
        """Stops its heartbeats and its engine watch without saying it left (what a crash
        leaves behind)."""
        self._watch.stop()
        if self._presence is not None:
            self._presence.silence()

    def run_once(self, timeout_s: float = 0.2) -> int:
        self.join()
        if self.engine_dead:  # it takes nothing more; `run` returns, `close` says why
            time.sleep(timeout_s)
            return 0
        room = self._lookahead - len(self._queue)
        # With work queued, a slot may free up any moment: look again soon. New work ends
        # the wait at once, so a light tenant's request is seen as it arrives.
        wait = timeout_s if not len(self._queue) else min(timeout_s, self.QUEUED_WAIT_S)
        if room > 0:
            records = self._consumer.poll(max_records=min(500, room), timeout_s=wait)
        else:  # read as far ahead as it may: only a slot can change anything
            time.sleep(wait)
            records = []
        assigned = self._consumer.assignment()
        if assigned != self._assigned:
            # A rebalance: what was read ahead may be another owner's now. Start over from
            # the committed positions (and read each partition to its end before taking).
            self._consumer.seek_to_committed()
            self._reset(assigned)
            return 0
        for record in records:
            self._take_in(record)
        now = datetime.now(timezone.utc)
        outputs: Writes = []
        if time.monotonic() >= self._next_sweep or self._cancels.pending_for(self._items):
            outputs += self._sweep(now)
        starting = self._choose(now, outputs)
        if starting and self.engine_dead:
            # It died while choosing: nothing is taken, and all of it stays on the log,
            # uncommitted, for the other workers.
            with self._slots_lock:
                for item, _, _ in starting:
                    self._slots.finished(item.tenant_id)
                    self._kv.finished(item.value.request_id)
            return 0
        offsets = self._positions.commit_offsets()
        # Positions that moved past records needing nothing (its own takes read back, work
        # someone else took) wait for the next take (`IdlePositions`).
        if not outputs and not self._idle.due(offsets != self._committed):
            return 0
        # The engine starts on them while the take commits (on Kafka, a transaction of a
        # few round trips); they write nothing until it has.
        taken: Future = Future()
        serving = [self._launch(item, started, priority, taken) for item, started, priority in starting]

        def committed() -> None:
            # Before the commit is visible to new readers (on Kafka, its markers): what the
            # generations write from now on still comes after their take on the log.
            taken.set_result(True)

        try:
            self._consumer.commit_with(outputs, offsets=offsets, on_committed=committed)
        except BaseException as exc:
            # Nothing of this unit was written (the transaction aborted): what began stops
            # without a trace, and reading starts again from what is committed.
            if taken.done():  # committed, then failed waiting to see it: the work is taken
                raise
            taken.set_result(False)
            self._abandon(starting, serving)
            if not isinstance(exc, (Fenced, EventLogError)):
                raise
            logger.warning("%s: taking work failed (%r); reading again from the committed positions",
                           self.worker_id, exc)
            self._consumer.seek_to_committed()
            self._reset(self._consumer.assignment())
            return 0
        self._committed = offsets  # `taken` resolved in on_committed
        self._idle.saved()
        return len(starting)

    def _abandon(self, starting: list[tuple[WorkItem, Envelope, int]], serving: list[Future]) -> None:
        """Stops generations whose take failed, and waits (bounded) until they are out of
        the engine, so the same request, taken again, never meets its abandoned self there."""
        for _, started, _ in starting:
            self._cancels.untaken(started.payload.request_id)
        _, left = wait(serving, timeout=self.ABANDON_WAIT_S)
        if left:
            logger.error("%s: %d abandoned generations still in the engine after %ss",
                         self.worker_id, len(left), self.ABANDON_WAIT_S)

    def _take_in(self, record: Record) -> None:
        self._positions.saw(record)
        try:
            env = decode(record.value)
        except EventDecodeError as exc:
            logger.warning("unreadable work item %s/%s@%s: %s", record.topic, record.partition, record.offset, exc)
            return
        p = env.payload
        if isinstance(p, GenerationQueued):
            request_id = p.request.request_id
            if request_id in self._items:
                return
            item = Item(env.tenant_id, p.request.priority, p.request.input_tokens + p.request.max_output_tokens,
                        QueuedWork(record.topic, record.partition, record.offset, env),
                        weight=p.fair_share_weight or 1.0)
            self._items[request_id] = item
            self._positions.hold((record.topic, record.partition), record.offset)
            with self._slots_lock:  # `offer` looks at the queue from admission's thread
                self._queue.push(item)
                self._slots.seen(env.tenant_id, item.weight)
        elif (item := self._items.pop(getattr(p, "request_id", ""), None)) is not None:
            # Someone (a previous owner of this partition) took it already.
            self._queue.drop(item)
            self._release(item.value)

    def _end_early(self, item: WorkItem, now: datetime) -> Writes:
        """Ends a queued item without running it: cancelled, or its deadline passed."""
        env = item.value.queued
        req = env.payload.request
        timings = Timings(queued_ms=_ms_since(env.payload.queued_at, now))
        reason = self._cancels.cancelled.get(req.request_id)
        if reason:
            end = GenerationCancelled(request_id=req.request_id, reason=reason, timings=timings)
        else:
            end = GenerationFailed(request_id=req.request_id, error_code="deadline_expired",
                                   message="deadline passed in the queue", timings=timings)
        terminal = caused_by(env, end)
        return to_outputs([(topics.OUTCOMES, terminal), (topics.STREAM, terminal)]) + [self._mark(item, terminal)]

    def _mark(self, item: WorkItem, env: Envelope) -> tuple[str, Message]:
        """`env` as the mark that `item` was taken or ended: in the item's own partition,
        where a later owner of that partition reads it before starting anything there."""
        work = item.value
        return beside(self._topics[work.topic], env, work.partition)

    def _should_end(self, item: WorkItem, now: datetime) -> bool:
        req = item.value.queued.payload.request
        return req.request_id in self._cancels.cancelled or (req.deadline_at is not None and req.deadline_at <= now)

    def _sweep(self, now: datetime) -> Writes:
        self._next_sweep = time.monotonic() + self.SWEEP_S
        outputs: Writes = []
        for item in [i for i in self._queue.items() if self._should_end(i, now)]:
            outputs += self._end_early(item, now)
            self._forget(item)
        return outputs

    def _forget(self, item: WorkItem) -> None:
        self._queue.drop(item)
        self._items.pop(item.value.request_id, None)
        self._release(item.value)

    def _release(self, work: QueuedWork) -> None:
        """Its partition's commit point may move past it (taken, ended, or someone else's)."""
        self._positions.release(work.topic_partition, work.offset)

    def _choose(self, now: datetime, outputs: Writes) -> list[tuple[WorkItem, Envelope, int]]:
        """Takes items while their tenants may have a slot; appends what to write to `outputs`."""
        # Only partitions with work queued are looked at: of the many a worker may own
        # (`topics.WORK_PARTITIONS` a topic), most are idle, and a look may cost a read.
        held = self._positions.held
        blocked = {tp for tp in list(self._positions.catch_up)
                   if held.get(tp) and not self._positions.ready(tp, self._log, self._consumer)}
        starting = []
        with self._slots_lock:
            def eligible(item: WorkItem) -> bool:
                return (item.value.topic_partition not in blocked and self._slots.may_start(item.tenant_id)
                        and self._kv.fits(item.value.request_id, self._kv.claim(item.value.queued.payload.request)))

            while (item := self._queue.pop(eligible)) is not None:
                self._items.pop(item.value.request_id, None)
                self._release(item.value)
                if self._should_end(item, now):
                    outputs += self._end_early(item, now)
                    continue
                started, priority = self._start_locked(item.value.queued, now)
                # Its stream copy follows the commit, through the stream writer: a
                # transaction open on a stream partition would hold back other streams.
                outputs += to_outputs([(topics.OUTCOMES, started)]) + [self._mark(item, started)]
                starting.append((item, started, priority))
        return starting

    def _start_locked(self, queued: Envelope, now: datetime) -> tuple[Envelope, int]:
        """The `GenerationStarted` of queued work and its engine priority; counts its slot."""
        req = queued.payload.request
        started = caused_by(queued, GenerationStarted(
            request_id=req.request_id, worker_id=self.worker_id, model_revision=self.revision or req.model_revision,
            engine_config_hash=self.engine_config_hash,
            queued_ms=_ms_since(queued.payload.queued_at, now)))
        # vLLM's order for what waits inside it: class first, then the lighter tenant.
        priority = PRIORITY.get(req.priority, 1) * 1000 + min(999, self._slots.in_flight[queued.tenant_id])
        self._slots.started(queued.tenant_id, queued.payload.fair_share_weight)
        self._kv.started(req.request_id, self._kv.claim(req))
        return started, priority

    def offer(self, queued: Envelope, work_topic: Topic) -> Taking | None:
        """Admitted work from the admission processor in this process (its `Taker`): started
        now if it is this worker's pool, the engine has a slot free (never a take-ahead one:
        taken here, it must not wait) and KV for it, the tenant is within its share and no
        queued work comes first; otherwise None, and it is queued as usual. The generation
        writes nothing until the admission's commit is through (`Taking.resolve`)."""
        if work_topic.name not in self._topics or self.engine_dead:
            return None
        req = queued.payload.request
        with self._slots_lock:
            if (not self._slots.may_run_at_once(queued.tenant_id) or self._queued_goes_first(queued.tenant_id)
                    or not self._kv.fits(req.request_id, self._kv.claim(req), wait=False)):
                return None
            started, priority = self._start_locked(queued, datetime.now(timezone.utc))
        item = Item(queued.tenant_id, req.priority, req.input_tokens + req.max_output_tokens,
                    QueuedWork(work_topic.name, -1, -1, queued), weight=queued.payload.fair_share_weight or 1.0)
        taken: Future = Future()
        serving = self._launch(item, started, priority, taken)

        def resolve(committed: bool) -> None:
            taken.set_result(committed)
            if not committed:
                self._abandon([(item, started, priority)], [serving])
        return Taking(started, resolve)

    def _queued_goes_first(self, tenant_id: str) -> bool:
        """Whether queued work comes before work offered now for `tenant_id`: the tenant's
        own (its order holds), or any the worker may start in the slot (first come). Work
        of tenants over their share waits either way, so under a heavy tenant's flood a
        light tenant's request is still taken at once. Holds `_slots_lock`."""
        waiting = self._queue.queued_tenants()
        return tenant_id in waiting or any(self._slots.may_start(t) for t in waiting)

    def _launch(self, item: WorkItem, started: Envelope, priority: int, taken: Future) -> Future:
        """Starts taken work on the engine, its prompt read meanwhile (a read is harmless if
        the take fails); it writes nothing until `taken` resolves True."""
        prompt = self._io.submit(fetch_prompt, self._log, item.value.queued.payload.request.prompt_ref)
        self._cancels.in_flight[started.payload.request_id] = ""
        self._serving[started.payload.request_id] = (started, taken)
        return self._runner.submit_nowait(self._serve(item, started, priority, prompt, taken))

    async def _serve(self, item: WorkItem, started_env: Envelope, priority: int, prompt: Future, taken: Future) -> None:
        try:
            ended = await serve_generation(self._serving_engine, self._cancels, item.value.queued, started_env,
                                           self._writer, prompt, taken, priority=priority, digests=self._digests)
            self.served += ended
        finally:
            self._serving.pop(started_env.payload.request_id, None)
            self._cancels.in_flight.pop(started_env.payload.request_id, None)
            with self._slots_lock:
                self._slots.finished(item.tenant_id)
                self._kv.finished(started_env.payload.request_id)

    def run(self, stop: threading.Event, readiness: Readiness | None = None) -> None:
        """Serves until `stop` is set or its engine dies (`exit_code` then says so). A log
        that fails is waited out with backoff (`readiness` down meanwhile); running
        generations go on, and reading starts again from the committed positions."""
        keep_running(self.run_once, stop, readiness=readiness or Readiness("worker"), recover=self.recover,
                     until=lambda: self.engine_dead)

    def recover(self) -> None:
        """After a transient failure anywhere in `run_once`: what was read ahead is
        forgotten; the next look seeks to the committed positions and reads from there."""
        self._assigned = None

    def close(self, drain_timeout_s: float = 30.0) -> None:
        """Lets running generations finish; queued ones stay uncommitted for the next owner.
        With its engine dead, they have failed already, or fail here (`_fail_stranded`)."""
        deadline, cut = time.monotonic() + drain_timeout_s, False
        while self.in_flight and time.monotonic() < deadline:
            if self.engine_dead and not cut:  # a dead engine's generations end at once, or never
                cut, deadline = True, min(deadline, time.monotonic() + self.DEAD_DRAIN_S)
            time.sleep(0.05)
        dead = self.engine_dead
        if dead:
            self._fail_stranded()
        self._watch.stop()
        if self._presence is not None and self._joined:
            if dead:
                self._presence.close("engine_dead", exit_code=self.exit_code)
            else:
                self._presence.close("shutdown")
        self._cancels.stop()
        self._consumer.close()
        self._io.shutdown(wait=False)

    def _fail_stranded(self) -> None:
        """Ends, from here, the taken generations a dead engine left hanging (its loop no
        longer runs them): failed, with what reached the log of them counted by nobody, so
        their reservations settle now instead of at deadline + grace."""
        for request_id, (started, taken) in list(self._serving.items()):
            if not (taken.done() and taken.result()):
                continue  # never taken: nothing of it is on the log
            terminal = caused_by(started, GenerationFailed(
                request_id=request_id, error_code="engine_dead", message="the engine died mid-generation"))
            try:
                publish(self._log, topics.OUTCOMES, [terminal])
                publish(self._log, topics.STREAM, [terminal])
            except Exception:
                logger.exception("%s: could not end %s; it expires at its deadline", self.worker_id, request_id)
