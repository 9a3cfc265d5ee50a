"""A suspended tenant's work ends: admission asks for every open generation of the tenant
to be cancelled (`CancelRequested`, reason `admin`), which its worker ends (running or
queued) and admission then settles as any cancel. Its new requests are rejected."""
from __future__ import annotations

from models import topics
from models.events import new_event
from models.events_generation import CancelRequested
from models.reservations import ReservationBook
from pipelines.publish import Outputs


class SuspensionSweep:
    EVERY_S = 0.5  # how soon after a suspension its running work is asked to stop

    def __init__(self, registry_view):
        self._view = registry_view
        self._last = float("-inf")
        self._asked: set[str] = set()  # request ids whose cancel was decided

    def cancels(self, book: ReservationBook, *, monotonic: float) -> Outputs:
        """Cancels for the open work of suspended tenants not asked for yet (at most once
        per `EVERY_S`). After a rebuild they may be asked again: a worker ends a request once."""
        if monotonic - self._last < self.EVERY_S:
            return []
        self._last = monotonic
        suspended = self._view.refresh().suspended
        self._asked &= set(book.open)
        if not suspended:
            return []
        outputs: Outputs = []
        for reservation in list(book.open.values()):
            if reservation.tenant_id in suspended and reservation.request_id not in self._asked:
                self._asked.add(reservation.request_id)
                outputs.append((topics.REQUESTS, new_event(
                    CancelRequested(request_id=reservation.request_id, reason="admin"),
                    tenant_id=reservation.tenant_id, correlation_id=reservation.request_id)))
        return outputs
