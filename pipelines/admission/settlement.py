"""Settlement: every admitted request's reservation settles once, whichever way it ends.

Its worker's terminal (`handle_terminal`) charges what ran, never more than reserved, priced
at the revision that ran; a reservation with no end by its deadline plus grace expires
(`expire_overdue`), and a lost worker's generations fail (`end_lost`), both settled at zero.
The book closes the reservation as it settles, so a second end settles nothing. Admission
(`pipelines.admission.processor`) decides which of these apply, and writes what they return.
"""
from __future__ import annotations

import logging
from datetime import datetime

from models import topics
from models.events import Envelope, caused_by, new_event
from models.events_generation import (
    GenerationCancelled, GenerationCompleted, GenerationFailed, ReservationExpired, ReservationReleased,
    UsageSettled,
)
from models.registry import Registry
from models.reservations import Reservation, ReservationBook
from pipelines.admission.decisions import cost_micros
from pipelines.publish import Outputs

logger = logging.getLogger(__name__)


def settle(
    env: Envelope, reservation: Reservation, *, registry: Registry, book: ReservationBook,
    status: str, input_tokens: int, output_tokens: int, ran_revision: str | None = None,
    delivered_output_tokens: int | None = None,
) -> Outputs:
    """Charges what was used (never more than reserved) and releases the rest, priced at
    the revision that ran (`ran_revision`, as its worker said; the reserved one otherwise)."""
    used_tokens = min(reservation.tokens, input_tokens + output_tokens)
    revision = registry.revisions.get(ran_revision or reservation.model_revision)
    used_cost = min(reservation.cost_micros, cost_micros(revision, input_tokens, output_tokens))
    settled = caused_by(env, UsageSettled(
        request_id=reservation.request_id, reservation_id=reservation.reservation_id,
        terminal_status=status, input_tokens=input_tokens, output_tokens=output_tokens,
        cost_micros=used_cost, delivered_output_tokens=delivered_output_tokens))
    released = caused_by(env, ReservationReleased(
        request_id=reservation.request_id, reservation_id=reservation.reservation_id,
        released_tokens=reservation.tokens - used_tokens,
        released_cost_micros=reservation.cost_micros - used_cost))
    book.apply(settled)
    return [(topics.LEDGER, settled), (topics.LEDGER, released)]


def terminal_status(payload) -> str:
    if isinstance(payload, GenerationCompleted):
        return "completed"
    if isinstance(payload, GenerationCancelled):
        return "cancelled"  # by the client, a client gone, an admin or the deadline
    return "expired" if payload.error_code in ("expired", "deadline_expired") else "failed"


def handle_terminal(env: Envelope, *, registry: Registry, book: ReservationBook) -> Outputs:
    p = env.payload
    reservation = book.open.get(p.request_id)
    if reservation is None:
        return []  # already settled (or expired): a terminal event settles at most once
    return settle(env, reservation, registry=registry, book=book, status=terminal_status(p),
                  input_tokens=p.input_tokens, output_tokens=p.output_tokens,
                  ran_revision=getattr(p, "model_revision", None),
                  delivered_output_tokens=getattr(p, "delivered_output_tokens", None))


def expire_overdue(*, book: ReservationBook, now: datetime, read_to: datetime | None = None) -> Outputs:
    """Reservations whose request never ended by deadline + grace (a lost worker, say):
    the request fails as expired, and its reservation is settled at zero and released.
    Zero, because what a lost worker made never reached the ledger. `read_to`: when the
    caller last read all of its input; an end written before then has been settled, so a
    reservation is judged overdue as of then (a processor held up by a failover reads the
    ends that wait for it before taking them for missing)."""
    outputs: Outputs = []
    for reservation in book.expired(now if read_to is None else min(now, read_to)):
        cause = new_event(ReservationExpired(request_id=reservation.request_id,
                                             reservation_id=reservation.reservation_id),
                          tenant_id=reservation.tenant_id, correlation_id=reservation.request_id, occurred_at=now)
        failed = caused_by(cause, GenerationFailed(request_id=reservation.request_id, error_code="expired",
                                                   message="no result before the deadline"))
        book.apply(cause)
        outputs += [(topics.LEDGER, cause), (topics.OUTCOMES, failed), (topics.STREAM, failed)]
        outputs += settle(cause, reservation, registry=Registry(), book=book, status="expired",
                          input_tokens=0, output_tokens=0)
    return outputs


def end_lost(lost: list[tuple[Reservation, str]], *, book: ReservationBook, now: datetime) -> Outputs:
    """Generations of lost workers (`pipelines.admission.lost_workers`), with why: each fails as
    `worker_lost` (to the outcomes, and the stream, where a client may wait for its end) and
    is settled at zero, as an expiry is: what the worker made never reached the ledger."""
    outputs: Outputs = []
    for reservation, why in lost:
        if reservation.request_id not in book.open:
            continue  # settled since it was found
        failed = new_event(GenerationFailed(request_id=reservation.request_id, error_code="worker_lost", message=why),
                           tenant_id=reservation.tenant_id, correlation_id=reservation.request_id, occurred_at=now)
        logger.warning("%s of tenant %s fails: %s", reservation.request_id, reservation.tenant_id, why)
        outputs += [(topics.OUTCOMES, failed), (topics.STREAM, failed)]
        outputs += settle(failed, reservation, registry=Registry(), book=book, status="failed",
                          input_tokens=0, output_tokens=0)
    return outputs
