"""The admission processor: the single writer of each tenant's reservations.

It owns tenant partitions of the requests and outcomes topics (both keyed by tenant,
with equal partition counts), decides admit or reject for each request, queues admitted
work by priority, and settles every reservation exactly once. Its decisions and its
input positions are committed together (`commit_with`), so a restart never decides twice.
"""
from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime, timedelta, timezone

from models import topics
from models.events import Envelope, EventDecodeError, caused_by, decode, new_event
from models.events_generation import (
    BudgetReserved, GenerationAdmitted, GenerationCancelled, GenerationCompleted, GenerationFailed,
    GenerationQueued, GenerationRequested, ReservationExpired, ReservationReleased, UsageSettled,
)
from models.registry import Registry, Revision
from models.reservations import Reservation, ReservationBook
from pipelines.eventlog import EventLog, Fenced
from pipelines.routing import Outputs, to_outputs

logger = logging.getLogger(__name__)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def cost_micros(revision: Revision | None, input_tokens: int, output_tokens: int) -> int:
    """Price of the tokens; a partial thousand is charged, never rounded away."""
    if revision is None:
        return 0
    return (_ceil_div(input_tokens * revision.price_input_per_1k_micros, 1000)
            + _ceil_div(output_tokens * revision.price_output_per_1k_micros, 1000))


def handle_requested(
    env: Envelope, *, registry: Registry, book: ReservationBook, now: datetime, grace: timedelta,
) -> Outputs:
    req: GenerationRequested = env.payload
    if req.request_id in book.open or req.request_id in book.settled:
        return []  # the same request delivered twice is decided once
    revision = registry.revisions.get(req.model_revision)
    reservation_id = "res_" + uuid.uuid4().hex[:16]
    deadline = req.deadline_at or now + timedelta(minutes=10)
    reserved = BudgetReserved(
        request_id=req.request_id, reservation_id=reservation_id,
        tokens=req.input_tokens + req.max_output_tokens,
        cost_micros=cost_micros(revision, req.input_tokens, req.max_output_tokens),
        expires_at=deadline + grace, model_revision=req.model_revision,
    )
    work_topic = topics.WORK_BY_PRIORITY.get(req.priority, topics.WORK_NORMAL)
    reserved_env = caused_by(env, reserved)
    admitted = caused_by(env, GenerationAdmitted(
        request_id=req.request_id, reservation_id=reservation_id, work_topic=work_topic.name))
    queued = caused_by(env, GenerationQueued(request=req, reservation_id=reservation_id, queued_at=now))
    book.apply(reserved_env)
    return [(topics.LEDGER, reserved_env), (topics.LEDGER, admitted), (work_topic, queued)]


def settle(
    env: Envelope, reservation: Reservation, *, registry: Registry, book: ReservationBook,
    status: str, input_tokens: int, output_tokens: int,
) -> Outputs:
    used_tokens = min(reservation.tokens, input_tokens + output_tokens)
    used_cost = min(reservation.cost_micros,
                    cost_micros(registry.revisions.get(reservation.model_revision), input_tokens, output_tokens))
    settled = caused_by(env, UsageSettled(
        request_id=reservation.request_id, reservation_id=reservation.reservation_id,
        terminal_status=status, input_tokens=input_tokens, output_tokens=output_tokens,
        cost_micros=used_cost))
    released = caused_by(env, ReservationReleased(
        request_id=reservation.request_id, reservation_id=reservation.reservation_id,
        released_tokens=reservation.tokens - used_tokens,
        released_cost_micros=reservation.cost_micros - used_cost))
    book.apply(settled)
    return [(topics.LEDGER, settled), (topics.LEDGER, released)]


_STATUS = {GenerationCompleted: "completed", GenerationFailed: "failed", GenerationCancelled: "cancelled"}


def handle_terminal(env: Envelope, *, registry: Registry, book: ReservationBook) -> Outputs:
    p = env.payload
    reservation = book.open.get(p.request_id)
    if reservation is None:
        return []  # already settled (or expired): a terminal event settles at most once
    return settle(env, reservation, registry=registry, book=book, status=_STATUS[type(p)],
                  input_tokens=p.input_tokens, output_tokens=p.output_tokens)


def expire_overdue(*, book: ReservationBook, now: datetime) -> Outputs:
    """Reservations whose request never ended by deadline + grace (a lost worker, say):
    the request fails as expired, and its reservation is settled at zero and released."""
    outputs: Outputs = []
    for reservation in book.expired(now):
        cause = new_event(ReservationExpired(request_id=reservation.request_id,
                                             reservation_id=reservation.reservation_id),
                          tenant_id=reservation.tenant_id, correlation_id=reservation.request_id)
        failed = caused_by(cause, GenerationFailed(request_id=reservation.request_id, error_code="expired",
                                                   message="no result before the deadline"))
        outputs += [(topics.LEDGER, cause), (topics.OUTCOMES, failed), (topics.STREAM, failed)]
        outputs += settle(cause, reservation, registry=Registry(), book=book, status="expired",
                          input_tokens=0, output_tokens=0)
    return outputs


class AdmissionProcessor:
    """Consumes requests and outcomes of its tenant partitions; one unit of work per poll."""

    GROUP = "ledgerlm-admission"

    def __init__(self, log: EventLog, registry_view, *, grace: timedelta, member_id: str | None = None):
        self._log = log
        self._registry_view = registry_view
        self._grace = grace
        self._consumer = log.consumer(self.GROUP, [topics.REQUESTS.name, topics.OUTCOMES.name], member_id=member_id)
        self.book = ReservationBook()
        self.rejected_records = 0
        self._rebuild()

    def _rebuild(self) -> None:
        book = ReservationBook()
        for partition in range(self._log.partitions(topics.LEDGER.name)):
            offset = 0
            while batch := self._log.read(topics.LEDGER.name, partition, offset, max_records=5000):
                for record in batch:
                    book.apply(decode(record.value))
                offset = batch[-1].offset + 1
        self.book = book

    def _decide(self, env: Envelope, registry: Registry) -> Outputs:
        now = datetime.now(timezone.utc)
        if isinstance(env.payload, GenerationRequested):
            return handle_requested(env, registry=registry, book=self.book, now=now, grace=self._grace)
        if isinstance(env.payload, (GenerationCompleted, GenerationFailed, GenerationCancelled)):
            return handle_terminal(env, registry=registry, book=self.book)
        return []

    def run_once(self, timeout_s: float = 0.5) -> int:
        records = self._consumer.poll(max_records=200, timeout_s=timeout_s)
        registry = self._registry_view.refresh()
        outputs: Outputs = []
        for record in records:
            try:
                env = decode(record.value)
            except EventDecodeError as exc:
                # Counted and logged; the record stays on the log for inspection.
                self.rejected_records += 1
                logger.warning("unreadable record %s/%s@%s: %s", record.topic, record.partition, record.offset, exc)
                continue
            outputs += self._decide(env, registry)
        outputs += expire_overdue(book=self.book, now=datetime.now(timezone.utc))
        if not records and not outputs:
            return 0
        try:
            self._consumer.commit_with(to_outputs(outputs))
        except Fenced:
            logger.info("admission partitions moved; rebuilding from the ledger")
            self._consumer.seek_to_committed()
            self._rebuild()
        return len(records)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.run_once()

    def close(self) -> None:
        self._consumer.close()
