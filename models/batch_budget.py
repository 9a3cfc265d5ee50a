"""Batch budgets: each tenant's batch limits, its open chunk reservations and what it
used in the last day. Pure; the dispatcher that owns a tenant's partition is its single
writer (invariant 3), and rebuilds this from the batch events after a restart.

A chunk is reserved at its planned maximum (input tokens + max output tokens of every
request, priced with the pinned revision) before it runs, and settled at what it used,
never more than was reserved. So a batch can run out of budget, but never overrun it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from models.events import Envelope
from models.events_batch import BatchChunkQueued, BatchUsageSettled

DEFAULT_WINDOW = timedelta(days=1)
MAX_WINDOW = timedelta(days=7)  # settled usage older than this is forgotten


@dataclass(frozen=True)
class BatchLimits:
    """None means unlimited. Counted over a sliding `window`."""

    tokens_per_window: int | None = None
    spend_per_window_micros: int | None = None
    window: timedelta = DEFAULT_WINDOW


@dataclass
class TenantBatchBudget:
    open: dict[str, tuple[int, int]] = field(default_factory=dict)  # reservation_id -> (tokens, cost)
    settled: set[str] = field(default_factory=set)
    used: list[tuple[datetime, int, int]] = field(default_factory=list)  # (when, tokens, cost) of settlements

    def reserve(self, reservation_id: str, tokens: int, cost_micros: int) -> None:
        if reservation_id not in self.settled:
            self.open.setdefault(reservation_id, (tokens, cost_micros))

    def settle(self, reservation_id: str, when: datetime, tokens: int, cost_micros: int) -> None:
        if reservation_id in self.settled:
            return
        self.settled.add(reservation_id)
        reserved = self.open.pop(reservation_id, None)
        if reserved is not None:  # a settlement never charges more than was reserved
            tokens, cost_micros = min(tokens, reserved[0]), min(cost_micros, reserved[1])
        self.used.append((when, tokens, cost_micros))

    def committed(self, now: datetime, window: timedelta = DEFAULT_WINDOW) -> tuple[int, int]:
        """Tokens and cost counted against the limits now: open reservations plus what
        was used within the window."""
        self.used = [u for u in self.used if u[0] > now - MAX_WINDOW]
        recent = [u for u in self.used if u[0] > now - window]
        tokens = sum(t for t, _ in self.open.values()) + sum(u[1] for u in recent)
        cost = sum(c for _, c in self.open.values()) + sum(u[2] for u in recent)
        return tokens, cost

    def fits(self, limits: BatchLimits, tokens: int, cost_micros: int, now: datetime) -> bool:
        held_tokens, held_cost = self.committed(now, limits.window)
        if limits.tokens_per_window is not None and held_tokens + tokens > limits.tokens_per_window:
            return False
        if limits.spend_per_window_micros is not None and held_cost + cost_micros > limits.spend_per_window_micros:
            return False
        return True


@dataclass
class BudgetBook:
    tenants: dict[str, TenantBatchBudget] = field(default_factory=dict)

    def of(self, tenant_id: str) -> TenantBatchBudget:
        return self.tenants.setdefault(tenant_id, TenantBatchBudget())

    def apply(self, env: Envelope) -> None:
        p = env.payload
        if isinstance(p, BatchChunkQueued):
            self.of(env.tenant_id).reserve(p.reservation_id, p.tokens, p.cost_micros)
        elif isinstance(p, BatchUsageSettled):
            self.of(env.tenant_id).settle(p.reservation_id, env.occurred_at, p.input_tokens + p.output_tokens,
                                          p.cost_micros)
