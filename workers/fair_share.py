"""Which queued generation a pool worker starts next.

`FairQueue`: deficit round robin by tokens across tenants, one ring per priority, high
before normal. Each turn a tenant's deficit grows by `quantum × weight` tokens and it
starts work while the deficit covers the next item's tokens (input + max output), so
over time each busy tenant gets tokens in proportion to its weight, whatever the
number or size of its requests. The weight is the tenant's `fair_share_weight` limit,
which each item carries as admission decided it (`GenerationQueued.fair_share_weight`),
so a worker weighs its queue without reading the registry; the head item's counts.

`Headroom`: which tenants may take a free engine slot. Every slot is used (no capacity
is held back while only one tenant is busy), except the last free one: a tenant already
over its fair share of slots may not take it while another tenant was active recently.
That slot waits for the light tenant, whose next request then starts at once instead of
waiting for a heavy tenant's generation to end. A tenant's fair share of slots is in
proportion to its weight among the recently active tenants (at least one slot), so under
backlog, when every free slot is the last one, the slots, like the queue, go by weight.
"""
from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Generic, Iterable, TypeVar

T = TypeVar("T")
PRIORITIES = ("high", "normal")


@dataclass
class Item(Generic[T]):
    tenant_id: str
    priority: str
    tokens: int
    value: T  # what is queued (a pool worker queues `workers.queued_work.QueuedWork`)
    dropped: bool = False  # taken elsewhere meanwhile: skipped, never started
    weight: float = 1.0  # its tenant's fair-share weight, as admitted


@dataclass
class _Ring:
    order: deque = field(default_factory=deque)  # tenants with queued work, in turn order
    queues: dict = field(default_factory=dict)  # tenant -> deque[Item]
    deficit: Counter = field(default_factory=Counter)
    granted: set = field(default_factory=set)  # tenants whose current turn got its quantum


class FairQueue(Generic[T]):
    def __init__(self, *, quantum: int = 256, weight: Callable[[str], float] | None = None):
        """`weight`: a tenant's weight; None takes the one its head item carries."""
        if quantum <= 0:
            raise ValueError("quantum must be positive")
        self.quantum, self.weight = quantum, weight
        self._rings = {p: _Ring() for p in PRIORITIES}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, item: Item[T]) -> None:
        ring = self._rings["high" if item.priority == "high" else "normal"]
        if item.tenant_id not in ring.queues:
            ring.queues[item.tenant_id] = deque()
            ring.order.append(item.tenant_id)
        ring.queues[item.tenant_id].append(item)
        self._size += 1

    def drop(self, item: Item[T]) -> None:
        """Withdraws a queued item (lazily: it is skipped when reached)."""
        if not item.dropped:
            item.dropped = True
            self._size -= 1

    def queued_tenants(self) -> set[str]:
        return {t for ring in self._rings.values() for t in ring.queues}

    def items(self) -> Iterable[Item[T]]:
        for ring in self._rings.values():
            for queue in ring.queues.values():
                yield from (i for i in queue if not i.dropped)

    def pop(self, eligible: Callable[[Item[T]], bool] = lambda item: True) -> Item[T] | None:
        """The next item by priority and deficit round robin among tenants whose next item
        is eligible (its tenant may take a slot, say)."""
        for priority in PRIORITIES:
            ring = self._rings[priority]
            self._discard_dropped(ring)
            if not any(eligible(ring.queues[t][0]) for t in ring.order):
                continue
            while True:
                tenant = ring.order[0]
                if not eligible(ring.queues[tenant][0]):
                    ring.granted.discard(tenant)
                    ring.order.rotate(-1)
                    continue
                head = ring.queues[tenant][0]
                if tenant not in ring.granted:
                    weight = head.weight if self.weight is None else self.weight(tenant)
                    ring.deficit[tenant] += self.quantum * weight
                    ring.granted.add(tenant)
                if ring.deficit[tenant] >= head.tokens:
                    ring.deficit[tenant] -= head.tokens
                    self._take(ring, tenant)
                    self._size -= 1
                    return head
                ring.granted.discard(tenant)
                ring.order.rotate(-1)
        return None

    def _take(self, ring: _Ring, tenant: str) -> None:
        queue = ring.queues[tenant]
        queue.popleft()
        while queue and queue[0].dropped:
            queue.popleft()
        if not queue:
            self._forget(ring, tenant)

    def _discard_dropped(self, ring: _Ring) -> None:
        for tenant in list(ring.order):
            queue = ring.queues[tenant]
            while queue and queue[0].dropped:
                queue.popleft()
            if not queue:
                self._forget(ring, tenant)

    @staticmethod
    def _forget(ring: _Ring, tenant: str) -> None:
        # An idle tenant keeps no credit: DRR's deficit is for work that is waiting.
        del ring.queues[tenant]
        ring.order.remove(tenant)
        ring.deficit.pop(tenant, None)
        ring.granted.discard(tenant)


class Headroom:
    """Engine slots by tenant; see the module docstring for the one slot it keeps.

    `take_ahead` slots beyond the engine's capacity hold work that waits inside the engine.
    They follow the rule of the last slot: a tenant over its fair share takes them only
    while no other tenant is active, so a light tenant never finds every engine slot taken
    by a heavy one's work and its own waiting behind it."""

    def __init__(self, capacity: int, *, take_ahead: int = 0, recent_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        if capacity <= 0 or take_ahead < 0:
            raise ValueError("capacity must be positive and take_ahead not negative")
        self.capacity, self.take_ahead, self.recent_s, self._clock = capacity, take_ahead, recent_s, clock
        self.in_flight: Counter = Counter()
        self._last_seen: dict[str, float] = {}
        self._weights: dict[str, float] = {}  # as the tenant's latest work carried it

    @property
    def free(self) -> int:
        return self.capacity + self.take_ahead - sum(self.in_flight.values())

    def seen(self, tenant_id: str, weight: float | None = None) -> None:
        """Work of the tenant arrived (queued or started), carrying its weight if given."""
        self._last_seen[tenant_id] = self._clock()
        if weight is not None:
            self._weights[tenant_id] = weight

    def may_start(self, tenant_id: str) -> bool:
        total = sum(self.in_flight.values())
        if total >= self.capacity + self.take_ahead:
            return False
        if total < self.capacity - 1:
            return True
        now = self._clock()
        others = [t for t, at in self._last_seen.items() if t != tenant_id and now - at <= self.recent_s]
        return not others or self.in_flight[tenant_id] < self.fair_slots(tenant_id, others)

    def fair_slots(self, tenant_id: str, others: list[str]) -> int:
        """The tenant's share of the engine's slots among itself and `others`, by weight."""
        weight = self._weights.get(tenant_id, 1.0)
        total = weight + sum(self._weights.get(t, 1.0) for t in others)
        # The epsilon keeps an exact share (4 × 3/4) from falling a slot short in floats.
        return max(1, int(self.capacity * weight / total + 1e-9))

    def may_run_at_once(self, tenant_id: str) -> bool:
        """`may_start`, in a slot inside the engine's capacity: work started now runs at
        once instead of waiting in a take-ahead slot."""
        return sum(self.in_flight.values()) < self.capacity and self.may_start(tenant_id)

    def started(self, tenant_id: str, weight: float | None = None) -> None:
        self.in_flight[tenant_id] += 1
        self.seen(tenant_id, weight)

    def finished(self, tenant_id: str) -> None:
        self.in_flight[tenant_id] -= 1
        if self.in_flight[tenant_id] <= 0:
            del self.in_flight[tenant_id]
        self.seen(tenant_id)
