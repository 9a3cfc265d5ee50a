"""Open reservations and usage of the tenants one admission processor owns. Pure state:
built by applying ledger events (at their event times), so a restarted processor
rebuilds exactly the state its predecessor decided with."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from datetime import datetime

from models.events import Envelope
from models.events_generation import (
    BudgetReserved, GenerationRejected, ReservationExpired, ReservationReleased, UsageSettled,
)
from models.quota import TenantUsage


@dataclass
class Reservation:
    reservation_id: str
    request_id: str
    tenant_id: str
    tokens: int
    cost_micros: int
    expires_at: datetime
    model_revision: str = ""
    reserved_at: datetime | None = None
    worker_id: str | None = None  # the worker running it, once its `GenerationStarted` is read


@dataclass
class ReservationBook:
    open: dict[str, Reservation] = field(default_factory=dict)  # by request_id
    # Request ids decided or settled, so a redelivered request or a late terminal is ignored.
    # Grows with the ledger; a snapshot of the book would bound the rebuild (not done yet).
    settled: set[str] = field(default_factory=set)
    usage: dict[str, TenantUsage] = field(default_factory=dict)  # by tenant
    # Open reservations by the worker running them (from the outcomes topic, not the ledger:
    # see `pipelines.admission.lost_workers`), so a lost worker's generations are found without a scan.
    running: dict[str, set[str]] = field(default_factory=dict)  # worker_id -> request ids
    # (expires_at, request_id) of every reservation opened, earliest first, so the look for
    # overdue ones (on every admission poll) reads only those due; closed ones are dropped
    # from it lazily, when they reach its top.
    _by_expiry: list[tuple[datetime, str]] = field(default_factory=list, repr=False, compare=False)

    def usage_of(self, tenant_id: str) -> TenantUsage:
        if tenant_id not in self.usage:
            self.usage[tenant_id] = TenantUsage()
        return self.usage[tenant_id]

    def apply(self, env: Envelope) -> None:
        p = env.payload
        if isinstance(p, BudgetReserved):
            if p.request_id in self.open or p.request_id in self.settled:
                return
            self.open[p.request_id] = Reservation(
                p.reservation_id, p.request_id, env.tenant_id, p.tokens, p.cost_micros, p.expires_at, p.model_revision,
                reserved_at=env.occurred_at,
            )
            heapq.heappush(self._by_expiry, (p.expires_at, p.request_id))
            self.usage_of(env.tenant_id).reserve(p.request_id, env.occurred_at, p.tokens, p.cost_micros)
        elif isinstance(p, UsageSettled):
            self._close(env, p.request_id, p.input_tokens + p.output_tokens, p.cost_micros)
        elif isinstance(p, ReservationExpired):
            self._close(env, p.request_id, 0, 0)
        elif isinstance(p, GenerationRejected):
            self.rejected(p.request_id)
        elif isinstance(p, ReservationReleased):
            pass  # the release accompanies a settlement, which closed the reservation

    def _close(self, env: Envelope, request_id: str, tokens: int, cost_micros: int) -> None:
        reservation = self.open.pop(request_id, None)
        if reservation is not None:
            self._unrun(reservation)
        self.settled.add(request_id)
        self.usage_of(env.tenant_id).close(request_id, env.occurred_at, tokens, cost_micros)

    def started(self, request_id: str, worker_id: str) -> None:
        """`worker_id` runs the open request (a later start, by another worker, replaces it)."""
        reservation = self.open.get(request_id)
        if reservation is None or reservation.worker_id == worker_id:
            return
        self._unrun(reservation)
        reservation.worker_id = worker_id
        self.running.setdefault(worker_id, set()).add(request_id)

    def ending(self, request_id: str) -> None:
        """Its worker wrote its end (still to be settled): no worker runs it any more."""
        reservation = self.open.get(request_id)
        if reservation is not None:
            self._unrun(reservation)

    def _unrun(self, reservation: Reservation) -> None:
        if reservation.worker_id is None:
            return
        ids = self.running.get(reservation.worker_id)
        if ids is not None:
            ids.discard(reservation.request_id)
            if not ids:
                del self.running[reservation.worker_id]
        reservation.worker_id = None

    def running_on(self, worker_id: str) -> list[Reservation]:
        """Open reservations whose generation `worker_id` runs, oldest first."""
        found = (self.open[r] for r in self.running.get(worker_id, ()) if r in self.open)
        return sorted(found, key=lambda r: (r.expires_at, r.request_id))

    def rejected(self, request_id: str) -> None:
        """A rejected request is decided too: delivered again, it is not decided twice."""
        self.settled.add(request_id)

    def decided(self, request_id: str) -> bool:
        return request_id in self.open or request_id in self.settled

    def for_tenant(self, tenant_id: str) -> list[Reservation]:
        return [r for r in self.open.values() if r.tenant_id == tenant_id]

    def expired(self, now: datetime) -> list[Reservation]:
        """Open reservations due by `now`, earliest first. They stay open (and are found again)
        until their expiry or settlement is applied."""
        due: list[tuple[datetime, str]] = []
        while self._by_expiry and self._by_expiry[0][0] <= now:
            entry = heapq.heappop(self._by_expiry)
            reservation = self.open.get(entry[1])
            if reservation is not None and reservation.expires_at == entry[0]:
                due.append(entry)
        for entry in due:
            heapq.heappush(self._by_expiry, entry)
        return [self.open[request_id] for _, request_id in due]
