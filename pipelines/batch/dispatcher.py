"""The batch dispatcher: single writer of the batches and batch budgets of the tenants
whose `ledgerlm.batches` partitions it owns (the topic is keyed by tenant).

Each unit of work: poll → fold the records into the batch and budget books → reconcile
every open batch (validate, settle, queue chunks, finalize) → append the decisions and
commit the input positions in one `commit_with`. Side effects happen before the commit
(objects at derived keys, Celery tasks that are idempotent per chunk), so a crash
redoes them harmlessly and the log never records a decision whose effects are missing.

State is the fold of the owned partitions, read whole when ownership changes: its own
earlier decisions are on the same topic, and folding is idempotent, so records seen
twice (in the rebuild and again by the poll) change nothing.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Callable

from models import topics
from models.batch import BatchBook
from models.batch_budget import BatchLimits, BudgetBook
from models.events import Envelope, EventDecodeError, decode, new_event
from models.registry import Registry
from models.settings import Settings
from pipelines.admin.commands import RegistryView
from pipelines.batch.queue import ChunkQueue
from pipelines.batch.reconcile import DispatchOptions, Reconciler
from pipelines.eventlog import EventLog, Fenced
from pipelines.objectstore import ObjectStore
from pipelines.outage import Readiness, is_transient, keep_running
from pipelines.publish import to_outputs

logger = logging.getLogger(__name__)
TOPIC = topics.BATCHES


def limits_from_settings(settings: Settings) -> Callable[[str, Registry], BatchLimits]:
    """A tenant's batch limits: its own `batch_tokens_per_window` (TenantLimitsChanged)
    over its window when set, else the platform-wide daily defaults from settings."""
    default = BatchLimits(settings.batch_tokens_per_day, settings.batch_spend_per_day_micros)

    def limits_for(tenant_id: str, registry: Registry) -> BatchLimits:
        own = registry.limits_for(tenant_id)
        if own.batch_tokens_per_window is None:
            return default
        return BatchLimits(own.batch_tokens_per_window, default.spend_per_window_micros, own.window)

    return limits_for


def options_from_settings(settings: Settings) -> DispatchOptions:
    return DispatchOptions(chunk_size=settings.batch_chunk_size, chunks_in_flight=settings.batch_chunks_in_flight,
                           max_requests=settings.batch_max_requests,
                           chunk_time_limit_s=settings.batch_chunk_time_limit_s,
                           requeue_after_s=settings.batch_requeue_after_s)


class BatchDispatcher:
    GROUP = "ledgerlm-batch-dispatcher"

    def __init__(self, log: EventLog, registry_view: RegistryView, store: ObjectStore, queue: ChunkQueue, *,
                 options: DispatchOptions, limits_for: Callable[[str, Registry], BatchLimits],
                 member_id: str | None = None, clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 pool_live: Callable[[str], bool | None] | None = None):
        """`pool_live`: whether a dedicated pool has a live batch worker (default: the
        queue's own `has_worker`, where it has one)."""
        self._log, self._registry_view, self._clock = log, registry_view, clock
        self._consumer = log.consumer(self.GROUP, [TOPIC.name], member_id=member_id)
        self.book, self.budgets = BatchBook(), BudgetBook()
        self._assigned: set = set()
        self._reconciler = Reconciler(store=store, queue=queue, options=options, budget_of=self.budgets.of,
                                      limits_for=limits_for,
                                      pool_live=pool_live or getattr(queue, "has_worker", None))
        self.rejected_records = 0
        self.failed_units = 0
        self._readiness: Readiness | None = None  # `run`'s

    def _apply(self, env: Envelope) -> None:
        self.book.apply(env)
        self.budgets.apply(env)

    def _rebuild(self) -> None:
        self.book, self.budgets = BatchBook(), BudgetBook()
        self._reconciler.budget_of = self.budgets.of
        for record in self._log.read_topic(TOPIC.name, {partition: 0 for _, partition in self._assigned}, page=5000):
            self._decode_and_apply(record)

    def _decode_and_apply(self, record) -> None:
        try:
            self._apply(decode(record.value))
        except EventDecodeError as exc:
            # Counted and logged; the record stays on the log for inspection.
            self.rejected_records += 1
            logger.warning("unreadable record %s/%s@%s: %s", record.topic, record.partition, record.offset, exc)

    def run_once(self, timeout_s: float = 0.5) -> int:
        records = self._consumer.poll(max_records=500, timeout_s=timeout_s)
        assignment = self._consumer.assignment()
        if assignment != self._assigned:
            self._assigned = set(assignment)
            self._rebuild()
        for record in records:
            self._decode_and_apply(record)
        outputs: list[tuple] = []

        def emit_for(tenant_id: str, batch_id: str):
            def emit(payload) -> None:
                env = new_event(payload, tenant_id=tenant_id, correlation_id=batch_id)
                self._apply(env)  # later decisions of this pass see it at once
                outputs.append((TOPIC, env))
            return emit

        try:
            registry = self._registry_view.refresh()
            now = self._clock()
            for batch in self.book.active():
                self._reconciler.reconcile(batch, emit_for(batch.tenant_id, batch.batch_id), registry=registry,
                                           now=now)
            if records or outputs:
                self._consumer.commit_with(to_outputs(outputs))
        except Fenced:
            logger.info("batch partitions moved; rebuilding from the log")
            self._reset()
        except Exception as exc:
            # Nothing of this unit is committed; its records come again after a pause.
            self.failed_units += 1
            if is_transient(exc) and self._readiness is not None:
                self._readiness.down(exc)  # a service down: said once per outage, not per try
            else:
                logger.exception("batch dispatch failed; retrying the unit")
            self._reset()
            time.sleep(min(5.0, 0.2 * 2 ** min(self.failed_units, 5)))  # back off a failing dependency
            return 0
        self.failed_units = 0
        return len(records)

    def _reset(self) -> None:
        self._consumer.seek_to_committed()
        self._assigned = set()  # forces a rebuild on the next pass

    def run(self, stop: threading.Event, readiness: Readiness | None = None) -> None:
        """Dispatches until `stop` is set; a log that fails is waited out with backoff
        (`readiness` down meanwhile), then the book is rebuilt from the committed positions."""
        self._readiness = readiness or Readiness("batch-dispatcher")
        keep_running(self.run_once, stop, readiness=self._readiness, recover=self._recover,
                     healthy=lambda: self.failed_units == 0)

    def _recover(self) -> None:
        self._assigned = set()  # rebuilt on the next pass, even if this seek fails
        self._consumer.seek_to_committed()

    def close(self) -> None:
        self._consumer.close()


def dispatcher_from_settings(settings: Settings, log: EventLog, platform) -> BatchDispatcher:
    """`platform`: the process's `pipelines.bootstrap.Bootstrap`, which opens the adapters."""
    return BatchDispatcher(log, platform.registry_view(log), platform.object_store(), platform.chunk_queue(),
                           options=options_from_settings(settings), limits_for=limits_from_settings(settings))
