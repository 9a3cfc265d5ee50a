"""The admission processor: the single writer of each tenant's reservations.

It owns tenant partitions of the requests and outcomes topics (both keyed by tenant,
with the same partition count as the ledger), decides admit or reject for each request
(`models.quota.decide`), queues admitted work by pool and priority, and settles every
reservation exactly once. Its decisions and its input positions are committed together
(`commit_with`), so a restart never decides twice; whenever the partitions it owns
change, it rebuilds their state from the ledger before deciding anything.

Settlements need no one to wait for them: the book releases a reservation as it is
settled, so they linger briefly (`SETTLE_LINGER_S`) and go out with the next unit that
decides a request. Positions of records that decide nothing wait likewise
(`pipelines.idle_positions`). What waits is never lost: its inputs are committed with it.

KV: each admitted request holds a claim of its engine's KV cache (prompt plus max output
tokens) from its decision until it settles (`pipelines.admission.kv_claims`; the settling itself is
`pipelines.admission.settlement`), claimed again with the book whenever that is rebuilt.

Time: a request is decided at its own event time (never earlier than the last one
decided), and the ledger events of the decision carry that time, so a rebuilt processor
reasons as its predecessor did. Only the expiry sweep and the lost-worker watch read the
wall clock: a request whose worker stopped heartbeating (`pipelines.admission.lost_workers`) fails as
`worker_lost` and settles within seconds; one whose worker is unknown expires at deadline
plus grace.

Deciding one request is `pipelines.admission.admit`'s (`handle_requested`). Admitting and
taking in one unit: a pool worker in the same process may be given as the processor's
`taker`, which starts admitted work at once where its engine has a slot free; the start
goes out in the admission's own commit (`pipelines.admission.taking`).
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Callable

from models import topics
from models.events import Envelope, EventDecodeError, decode
from models.events_generation import (
    GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationQueued, GenerationRequested,
    GenerationStarted,
)
from models.registry import Registry
from models.reservations import ReservationBook
from pipelines.admission.admit import handle_requested
from pipelines.admission.capacity import CapacityBook, Floors, QueueBound, ServiceEstimate, key_of
from pipelines.admission.catch_up import CatchUp
from pipelines.eventlog import EventLog, EventLogError, Fenced, Record, TopicSpec
from pipelines.idle_positions import IdlePositions
from pipelines.admission.kv_claims import claim_of
from pipelines.admission.lost_workers import FleetWatch, note_running
from pipelines.outage import Readiness, is_transient, keep_running
from pipelines.admission.placement import DEFAULT_SLACK, FleetPlacement
from pipelines.publish import Outputs, to_outputs
from pipelines.admission.service_readback import read_back_rates
from pipelines.admission.settlement import end_lost, expire_overdue, handle_terminal
from pipelines.admission.suspension import SuspensionSweep
from pipelines.admission.taking import Taker, Takings

logger = logging.getLogger(__name__)
DEFAULT_LOST_AFTER_S = 5.0  # `Settings.worker_lost_after_s`


def rebuild(log: EventLog, partitions: set[int]) -> tuple[ReservationBook, datetime | None]:
    """The book of the given ledger partitions, and the latest decision time in them."""
    book, clock = ReservationBook(), None
    for record in log.read_topic(topics.LEDGER.name, {p: 0 for p in partitions}, page=5000):
        try:
            env = decode(record.value)
        except EventDecodeError:
            continue
        book.apply(env)
        clock = env.occurred_at if clock is None else max(clock, env.occurred_at)
    return book, clock


class AdmissionProcessor:
    """Consumes requests and outcomes of its tenant partitions; at most one unit of work per poll."""

    GROUP = topics.ADMISSION_GROUP
    # Settlements (and expiries) wait up to this long to go out with the next unit that
    # decides a request: nobody waits on them, since the book releases a reservation the
    # moment it is settled, so the next request is decided as if it were written.
    # A crash before they are written loses nothing: their inputs were not committed either,
    # and are read and settled again. Each unit on Kafka is a transaction (five round trips,
    # and markers), so a settlement alone cost as much as the reservation it ends.
    SETTLE_LINGER_S = 0.25
    POLL_RECORDS = 200

    def __init__(self, log: EventLog, registry_view, *, grace: timedelta, member_id: str | None = None,
                 floors: Floors | None = None, taker: Taker | None = None,
                 on_written: Callable[[Outputs], None] | None = None,
                 lost_after_s: float | None = DEFAULT_LOST_AFTER_S, fleet: FleetWatch | None = None,
                 queue_bound: QueueBound | None = None, affinity_slack: int = DEFAULT_SLACK):
        """`lost_after_s`: how long a worker is silent before its generations end (None: never,
        they expire); `fleet` replaces the watch it would make for that, and gives the live
        capacity admission decides with (`pipelines.admission.capacity`, bounded by `queue_bound`; `floors`:
        the service assumed before any is measured, `Settings.admission_floor_*`)."""
        self._log = log
        self._on_written = on_written  # told what each committed unit wrote (metrics)
        self._takings = Takings(taker)
        self._registry_view = registry_view
        self._grace = grace
        self._consumer = log.consumer(self.GROUP, [topics.REQUESTS.name, topics.OUTCOMES.name], member_id=member_id)
        self.book = ReservationBook()
        self.owned: set[int] | None = None  # ledger partitions the book was built for
        self._clock: datetime | None = None
        self._known_topics = {t.name for t in topics.ALL}
        self.rejected_records = 0
        # Positions of records that decided nothing (a start, a cancel, a repeated end) wait
        # for the next unit that writes something.
        self._idle = IdlePositions()
        self._settling: Outputs = []  # settlements decided, not yet written (`SETTLE_LINGER_S`)
        self._settling_since = 0.0
        # When admission last read all its input appended before then (`pipelines.admission.catch_up`): a
        # worker judged lost, or a reservation judged overdue, is judged no later, so every end
        # written before then has been read (and settled at its usage) first.
        self._read_to: datetime | None = None
        self._catch_up = CatchUp(log, self._consumer)
        if fleet is None and lost_after_s is not None:
            fleet = FleetWatch(log, lost_after_s=lost_after_s)
        self.fleet = fleet
        self.capacity = CapacityBook(fleet.view if fleet is not None else None, bound=queue_bound, floors=floors)
        self.estimate: ServiceEstimate = self.capacity.estimate  # the quota's, followed with the rates
        self.claims = self.capacity.kv_claims  # KV claims of open work (`pipelines.admission.kv_claims`)
        self._pruned_at = 0.0
        self.suspension = SuspensionSweep(registry_view)
        self.placement = FleetPlacement(fleet.view.live if fleet is not None else None, slack=affinity_slack,
                                        claims=self.claims, kv_overcommit=self.capacity.bound.kv_overcommit)

    @property
    def registry(self) -> Registry:
        """The registry as admission last read it: aliases, rollouts, revisions (a scrape
        reads it without a look at the admin topic)."""
        return self._registry_view.registry

    def _owned_now(self) -> set[int]:
        return {p for t, p in self._consumer.assignment() if t == topics.REQUESTS.name}

    def _rebuild(self, owned: set[int]) -> None:
        self.book, self._clock = rebuild(self._log, owned)
        self.capacity.forget_queue()
        self.placement.forget()
        registry = self._registry_view.refresh()  # the pools the rates were measured for
        read_back_rates(self._log, self._consumer, owned, self.capacity, key=lambda env: self._key(registry, env))
        if self.fleet is not None:  # which worker runs what: read back from the outcomes topic
            note_running(self._log, self.book, owned)
        self.claims.rebuild(self.book.open.values(), key=lambda r: key_of(registry.limits_for(r.tenant_id).pool,
                                                                          r.model_revision),
                            max_model_len=lambda rev: getattr(registry.revisions.get(rev), "max_model_len", None))
        self.owned = owned

    def _now(self, event_time: datetime) -> datetime:
        self._clock = event_time if self._clock is None else max(self._clock, event_time)
        return self._clock

    def _decide(self, env: Envelope, registry: Registry) -> Outputs:
        p = env.payload
        if isinstance(p, GenerationRequested):
            outputs = handle_requested(env, registry=registry, book=self.book, now=self._now(env.occurred_at),
                                       grace=self._grace, estimate=self.estimate,
                                       queued_at=datetime.now(timezone.utc), capacity=self.capacity)
            outputs = self._takings.offer(outputs)
            return self._claimed(outputs, env, registry)
        if isinstance(p, GenerationStarted):
            self.capacity.started(p.request_id, self._key(registry, env), p.queued_ms)
            self.book.started(p.request_id, p.worker_id)
            self.claims.started(p.request_id, p.worker_id)
        elif isinstance(p, (GenerationCompleted, GenerationFailed, GenerationCancelled)):
            self.capacity.ended(p.request_id, self._key(registry, env), p)
            self.placement.ended(p.request_id)
            self.claims.release(p.request_id)  # it settles now, or did already (a lost worker's)
            return handle_terminal(env, registry=registry, book=self.book)
        return []

    def _claimed(self, outputs: Outputs, env: Envelope, registry: Registry) -> Outputs:
        """Admitted work holds its KV claim: on the owner of the partition placed on, or on
        the taker that started it (which does not wait)."""
        req: GenerationRequested = env.payload
        key = self._key(registry, env)
        revision = registry.revisions.get(req.model_revision)
        claim = claim_of(req.input_tokens, req.max_output_tokens, revision.max_model_len if revision else None)
        placed: Outputs = []
        for topic, out in outputs:
            worker, running = None, isinstance(out.payload, GenerationStarted)
            if isinstance(out.payload, GenerationQueued):
                self.capacity.queued(req.request_id, key, req.priority)
                out = self.placement.place(topic, out, claim)
                worker = self.placement.owner_of(topic.name, out.payload.work_partition)
            if running or isinstance(out.payload, GenerationQueued):
                self.claims.hold(req.request_id, key, claim, high=req.priority == "high",
                                 worker_id=out.payload.worker_id if running else worker, running=running)
            placed.append((topic, out))
        return placed

    @staticmethod
    def _key(registry: Registry, env: Envelope):
        """(pool, revision) of a request or of its outcome (a failure or cancel names none:
        it is only used when what it ends was not seen queued)."""
        return key_of(registry.limits_for(env.tenant_id).pool, getattr(env.payload, "model_revision", ""))

    def _ensure_topics(self, outputs: Outputs) -> None:
        missing = {t for t, _ in outputs if t.name not in self._known_topics}
        if missing:  # a revision's or a dedicated pool's work topics, made on first use
            self._log.ensure_topics([TopicSpec(t.name, t.partitions, t.retention_ms) for t in missing])
            self._known_topics |= {t.name for t in missing}

    def run_once(self, timeout_s: float = 0.5) -> int:
        if self._settling:  # lingering settlements go out when due, however long a quiet poll waits
            timeout_s = min(timeout_s, max(0.0, self._settling_since + self.SETTLE_LINGER_S - time.monotonic()))
        polled_at = datetime.now(timezone.utc)
        records = self._consumer.poll(max_records=self.POLL_RECORDS, timeout_s=timeout_s)
        owned = self._owned_now()
        if owned != self.owned:
            # Partitions moved (or this is the first poll): decide nothing on a stale book.
            # What was polled comes again from the committed positions.
            logger.info("admission owns ledger partitions %s; rebuilding their state", sorted(owned))
            self._consumer.seek_to_committed()
            self._forget_unwritten()
            self._rebuild(owned)
            return 0
        if len(records) < self.POLL_RECORDS:
            self._read_to = self._catch_up.read_all_at(polled_at) or self._read_to
        try:
            outputs, settling = self._decide_records(records)
            self._linger(self._sweep(settling))
            if not outputs and not self._unit_due(bool(records)):
                return len(records)
            self._commit(self._settling + outputs)
        except BaseException as exc:
            # The book already holds these decisions, and none of them was written (the unit
            # aborted): rebuild it from the ledger, and read the inputs again, before deciding.
            # What was started for them leaves without a trace.
            self._takings.resolve(False)
            self.owned = None
            if not isinstance(exc, (Fenced, EventLogError)):
                raise
            logger.warning("admission could not commit (%r); rebuilding from the ledger", exc)
            self._consumer.seek_to_committed()
            self._forget_unwritten()
        return len(records)

    def _decide_records(self, records: list[Record]) -> tuple[Outputs, Outputs]:
        """Decisions on requests (someone waits for each), and settlements of the ends read."""
        # Only decisions on records read the registry: an empty poll makes no look.
        registry = self._registry_view.refresh() if records else None
        outputs: Outputs = []
        settling: Outputs = []
        for record in records:
            try:
                env = decode(record.value)
            except EventDecodeError as exc:
                # Counted and logged; the record stays on the log for inspection.
                self.rejected_records += 1
                logger.warning("unreadable record %s/%s@%s: %s", record.topic, record.partition, record.offset, exc)
                continue
            decided = self._decide(env, registry)
            if isinstance(env.payload, GenerationRequested):
                outputs += decided
            else:
                settling += decided
        return outputs, settling

    def _sweep(self, settling: Outputs) -> Outputs:
        """`settling` and what ends without a record read: reservations overdue, generations
        of a lost worker, a suspended tenant's work; queued work that ended unseen is forgotten."""
        now = datetime.now(timezone.utc)
        if self._read_to is not None:  # ends that wait to be read are settled first, at their usage
            settling += expire_overdue(book=self.book, now=now, read_to=self._read_to)
        if time.monotonic() - self._pruned_at >= 1.0:  # queued work that ended unseen (expired, lost)
            self._pruned_at = time.monotonic()
            self.capacity.prune(self.book.open)
            self.placement.prune(self.book.open)
            self.claims.prune(self.book.open)
        if self.fleet is not None:
            lost = self.fleet.lost(self.book, monotonic=time.monotonic(), read_to=self._read_to)
            settling += end_lost(lost, book=self.book, now=now)
        self.claims.release_settled(settling)  # expired, or a lost worker's: settled here, once
        settling += self.suspension.cancels(self.book, monotonic=time.monotonic())
        return settling

    def _linger(self, settling: Outputs) -> None:
        """Settlements wait for the next unit (`SETTLE_LINGER_S`)."""
        if settling and not self._settling:
            self._settling_since = time.monotonic()
        self._settling += settling

    def _commit(self, outputs: Outputs) -> None:
        """One unit: `outputs` and the positions of what was read, together."""
        self._ensure_topics(outputs)
        # Taken work may write as soon as the commit is through, before (on Kafka) its
        # markers make it visible: what it writes still follows its start on the log.
        self._consumer.commit_with(to_outputs(outputs), on_committed=lambda: self._takings.resolve(True))
        self._settling = []
        self._idle.saved()
        if self._on_written is not None:
            self._on_written(outputs)

    def _unit_due(self, polled: bool) -> bool:
        """With no request decided: whether what waits (settlements, or positions of records
        that decided nothing) is to be committed now."""
        if self._settling:
            return time.monotonic() - self._settling_since >= self.SETTLE_LINGER_S
        return self._idle.due(polled)

    def _forget_unwritten(self) -> None:
        """After a seek to the committed positions: what waited is decided again from there."""
        self._read_to = None
        self._settling = []
        self._idle.saved()

    def flush(self) -> None:
        """Writes settlements that wait, now (before a close)."""
        if self._settling:
            outputs, self._settling = self._settling, []
            self._consumer.commit_with(to_outputs(outputs))
            self._idle.saved()
            if self._on_written is not None:
                self._on_written(outputs)

    def run(self, stop: threading.Event, readiness: Readiness | None = None) -> None:
        """Decides until `stop` is set. A log that fails (broker down or frozen) is waited out
        with backoff, `readiness` down meanwhile; the book is rebuilt once it answers again."""
        keep_running(self.run_once, stop, readiness=readiness or Readiness("admission"), recover=self.recover)

    def recover(self) -> None:
        """After a unit failed on a transient error, wherever it failed: nothing it decided
        was written, so decide nothing on this book; the next `run_once` reads the inputs
        again from the committed positions and rebuilds the book from the ledger."""
        self._takings.resolve(False)
        self.owned = None
        self._forget_unwritten()

    def close(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # read and settled again by the next owner
            if not isinstance(exc, (Fenced, EventLogError)) and not is_transient(exc):
                raise
            logger.warning("admission closing with settlements unwritten (%r)", exc)
        if self.fleet is not None:
            self.fleet.close()
        self._consumer.close()
