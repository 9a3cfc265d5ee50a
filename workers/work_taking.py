"""Taking an interactive worker's work (`workers.interactive`): what it reads, what starts.

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
nothing is served twice. The engine starts while the take commits (`workers.work_running`);
a failed commit aborts the generation unwritten, and reading starts again from the
committed positions. Queued work cancelled or past its deadline ends here, unrun.

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
Once the engine is dead nothing more is taken; what was read ahead stays uncommitted.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from datetime import datetime, timezone

from models import topics
from models.events import Envelope, EventDecodeError, caused_by, decode
from models.events_generation import GenerationCancelled, GenerationFailed, GenerationQueued, GenerationStarted, Timings
from models.topics import Topic
from pipelines.admission.taking import Taking
from pipelines.eventlog import EventLog, EventLogError, Fenced, GroupConsumer, Message, Record, TopicSpec
from pipelines.idle_positions import IdlePositions
from pipelines.publish import beside, to_outputs
from workers.cancel_watch import CancelWatch
from workers.engine import InferenceEngine
from workers.fair_share import FairQueue, Headroom, Item
from workers.generation import PRIORITY
from workers.kv_gate import KvGate
from workers.queued_work import QueuedWork, WorkItem
from workers.work_positions import WorkPositions
from workers.work_running import WorkRunning

logger = logging.getLogger(__name__)
Writes = list[tuple[str, Message]]  # what one take commits: (topic name, message)
Starting = list[tuple[WorkItem, Envelope, int]]  # what one take starts: item, its start, its engine priority


def _ms_since(start: datetime, now: datetime) -> int:
    return max(0, int((now - start).total_seconds() * 1000))


def open_work(log: EventLog, pool: str, revision: str | None, worker_id: str) -> tuple[dict[str, Topic], GroupConsumer]:
    """The work topics of `pool` (pinned to `revision`: that revision's own), made sure of,
    by name, and the worker's consumer of them in its pool's group."""
    work_topics = {t.name: t for t in topics.pool_work_topics(pool, revision)}
    log.ensure_topics([TopicSpec(t.name, t.partitions, t.retention_ms) for t in work_topics.values()])
    return work_topics, log.consumer(topics.work_group(pool, revision), sorted(work_topics), member_id=worker_id)


class WorkTaking:
    """Takes a worker's work from `consumer` (of `work_topics`) and starts it on `running`:
    `running` engine slots and `take_ahead` more, within `engine`'s KV cache."""

    SWEEP_S = 0.25  # how often queued work is checked for cancels and passed deadlines
    # With work queued, how long one look for new work may wait: new work ends it at once,
    # a freed slot is seen at the next look. Shorter costs more than it gains on Kafka,
    # where every look is a round of the client's protocol work in Python.
    QUEUED_WAIT_S = 0.01

    def __init__(self, log: EventLog, consumer: GroupConsumer, work_topics: dict[str, Topic], engine: InferenceEngine,
                 cancels: CancelWatch, running_work: WorkRunning, *, worker_id: str, revision: str | None,
                 engine_config_hash: str | None, running: int, take_ahead: int, quantum: int = 256,
                 lookahead: int = 2000, kv_overcommit: float = 1.0, idle_positions_s: float = 1.0):
        self._log, self.consumer, self._topics = log, consumer, work_topics
        self._cancels, self._running = cancels, running_work
        self.worker_id, self.revision, self.engine_config_hash = worker_id, revision, engine_config_hash
        self.capacity = running + take_ahead
        self._lookahead = lookahead
        self._quantum = quantum
        self._idle_positions_s = idle_positions_s  # the longest moved positions wait for a take (`IdlePositions`)
        self._slots = Headroom(running, take_ahead=take_ahead)
        self._kv = KvGate.of_engine(engine, running, kv_overcommit, queued=lambda request_id: request_id in self._items)
        self._slots_lock = threading.Lock()
        self.assigned: set | None = None
        self._reset(set())
        self._next_sweep = 0.0

    def _reset(self, assigned: set) -> None:
        """Forgets everything read ahead; reading restarts at the committed positions."""
        self._queue: FairQueue[QueuedWork] = FairQueue(quantum=self._quantum)
        self._items: dict[str, WorkItem] = {}  # queued items by request id
        self._positions = WorkPositions.at_assignment(self._log, self.consumer, assigned)
        self._committed = self._positions.commit_offsets()
        self.idle = IdlePositions(self._idle_positions_s)
        self.assigned = assigned

    def recover(self) -> None:
        """What was read ahead is forgotten: the next look seeks to the committed positions."""
        self.assigned = None

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

    def run_once(self, timeout_s: float) -> int:
        """One look for work and one take of what may start; how many started."""
        records = self._read(timeout_s)
        if records is None:
            return 0
        for record in records:
            self._take_in(record)
        now = datetime.now(timezone.utc)
        outputs: Writes = []
        if time.monotonic() >= self._next_sweep or self._cancels.pending_for(self._items):
            outputs += self._sweep(now)
        starting = self._choose(now, outputs)
        if starting and self._running.engine_dead:
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
        if not outputs and not self.idle.due(offsets != self._committed):
            return 0
        return self._commit(starting, outputs, offsets)

    def _read(self, timeout_s: float) -> list[Record] | None:
        """New records of its work topics; None after a rebalance, which it starts over from."""
        room = self._lookahead - len(self._queue)
        # With work queued, a slot may free up any moment: look again soon. New work ends
        # the wait at once, so a light tenant's request is seen as it arrives.
        wait = timeout_s if not len(self._queue) else min(timeout_s, self.QUEUED_WAIT_S)
        if room > 0:
            records = self.consumer.poll(max_records=min(500, room), timeout_s=wait)
        else:  # read as far ahead as it may: only a slot can change anything
            time.sleep(wait)
            records = []
        assigned = self.consumer.assignment()
        if assigned != self.assigned:
            # A rebalance: what was read ahead may be another owner's now. Start over from
            # the committed positions (and read each partition to its end before taking).
            self.consumer.seek_to_committed()
            self._reset(assigned)
            return None
        return records

    def _commit(self, starting: Starting, outputs: Writes, offsets) -> int:
        """Commits the take of `starting` with `outputs` and the positions `offsets`; the
        engine starts on them meanwhile, and they write nothing until it has."""
        taken: Future = Future()
        serving = [self._launch(item.value.queued, started, priority, taken) for item, started, priority in starting]

        def committed() -> None:
            # Before the commit is visible to new readers (on Kafka, its markers): what the
            # generations write from now on still comes after their take on the log.
            taken.set_result(True)

        try:
            self.consumer.commit_with(outputs, offsets=offsets, on_committed=committed)
        except BaseException as exc:
            # Nothing of this unit was written (the transaction aborted): what began stops
            # without a trace, and reading starts again from what is committed.
            if taken.done():  # committed, then failed waiting to see it: the work is taken
                raise
            taken.set_result(False)
            self._running.abandon([started for _, started, _ in starting], serving)
            if not isinstance(exc, (Fenced, EventLogError)):
                raise
            logger.warning("%s: taking work failed (%r); reading again from the committed positions",
                           self.worker_id, exc)
            self.consumer.seek_to_committed()
            self._reset(self.consumer.assignment())
            return 0
        self._committed = offsets  # `taken` resolved in on_committed
        self.idle.saved()
        return len(starting)

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

    def _choose(self, now: datetime, outputs: Writes) -> Starting:
        """Takes items while their tenants may have a slot; appends what to write to `outputs`."""
        # Only partitions with work queued are looked at: of the many a worker may own
        # (`topics.WORK_PARTITIONS` a topic), most are idle, and a look may cost a read.
        held = self._positions.held
        blocked = {tp for tp in list(self._positions.catch_up)
                   if held.get(tp) and not self._positions.ready(tp, self._log, self.consumer)}
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

    def _launch(self, queued: Envelope, started: Envelope, priority: int, taken: Future) -> Future:
        """Starts taken work on the engine; its slot is free again once it has left it."""
        tenant_id, request_id = queued.tenant_id, started.payload.request_id

        def done() -> None:
            with self._slots_lock:
                self._slots.finished(tenant_id)
                self._kv.finished(request_id)
        return self._running.launch(queued, started, priority, taken, done)

    def offer(self, queued: Envelope, work_topic: Topic) -> Taking | None:
        """Admitted work from the admission processor in this process (its `Taker`): started
        now if it is this worker's pool, the engine has a slot free (never a take-ahead one:
        taken here, it must not wait) and KV for it, the tenant is within its share and no
        queued work comes first; otherwise None, and it is queued as usual. The generation
        writes nothing until the admission's commit is through (`Taking.resolve`)."""
        if work_topic.name not in self._topics or self._running.engine_dead:
            return None
        req = queued.payload.request
        with self._slots_lock:
            if (not self._slots.may_run_at_once(queued.tenant_id) or self._queued_goes_first(queued.tenant_id)
                    or not self._kv.fits(req.request_id, self._kv.claim(req), wait=False)):
                return None
            started, priority = self._start_locked(queued, datetime.now(timezone.utc))
        taken: Future = Future()
        serving = self._launch(queued, started, priority, taken)

        def resolve(committed: bool) -> None:
            taken.set_result(committed)
            if not committed:
                self._running.abandon([started], [serving])
        return Taking(started, resolve)

    def _queued_goes_first(self, tenant_id: str) -> bool:
        """Whether queued work comes before work offered now for `tenant_id`: the tenant's
        own (its order holds), or any the worker may start in the slot (first come). Work
        of tenants over their share waits either way, so under a heavy tenant's flood a
        light tenant's request is still taken at once. Holds `_slots_lock`."""
        waiting = self._queue.queued_tenants()
        return tenant_id in waiting or any(self._slots.may_start(t) for t in waiting)
