"""Open reservations of the tenants one admission processor owns. Pure state: built by
applying ledger events, so a restarted processor rebuilds it from the log."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from models.events import Envelope
from models.events_generation import BudgetReserved, ReservationExpired, ReservationReleased, UsageSettled


@dataclass
class Reservation:
    reservation_id: str
    request_id: str
    tenant_id: str
    tokens: int
    cost_micros: int
    expires_at: datetime
    model_revision: str = ""


@dataclass
class ReservationBook:
    open: dict[str, Reservation] = field(default_factory=dict)  # by request_id
    settled: set[str] = field(default_factory=set)  # request ids, so a late terminal is ignored

    def apply(self, env: Envelope) -> None:
        p = env.payload
        if isinstance(p, BudgetReserved):
            self.open[p.request_id] = Reservation(
                p.reservation_id, p.request_id, env.tenant_id, p.tokens, p.cost_micros, p.expires_at, p.model_revision
            )
        elif isinstance(p, (UsageSettled, ReservationExpired)):
            self.open.pop(p.request_id, None)
            self.settled.add(p.request_id)
        elif isinstance(p, ReservationReleased):
            pass  # the release accompanies a settlement, which closed the reservation

    def for_tenant(self, tenant_id: str) -> list[Reservation]:
        return [r for r in self.open.values() if r.tenant_id == tenant_id]

    def expired(self, now: datetime) -> list[Reservation]:
        return sorted((r for r in self.open.values() if r.expires_at <= now), key=lambda r: r.expires_at)
