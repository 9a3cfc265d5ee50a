"""A pool worker's own KV gate: it starts a taken request only while the claims of what it
runs (prompt plus max output tokens each, `pipelines.admission.kv_claims.claim_of`) and the request's
fit in its engine's KV cache times the overcommit (`Settings.kv_overcommit`), so the
engine is never handed more than its cache holds and preempts.

The engine hands out its cache in whole blocks and keeps some of it for itself (vLLM: one
null block), so a claim counts whole blocks, within what requests can hold: of 8 blocks of
128 tokens requests hold 7, so a claim of 490 tokens (4 blocks) runs beside three of one
block, not beside another of 490, as 980 of 1,024 tokens would say.

Admission places by the same claims, but its view is a pool's and a moment late; the worker
knows exactly what its own engine runs. An engine that reports no KV capacity is gated by
its slots alone, as before. A request bigger than the whole cache runs when the worker is
idle, alone. So that big requests are not passed over forever by smaller ones, the first
request found not to fit is kept (`_waiting`): until it starts (or leaves the worker's
queue) others start only if they fit beside it too, so the engine drains until it does.

Not thread-safe: the worker calls it under its slots lock.
"""
from __future__ import annotations

import time
from typing import Callable

from pipelines.admission.kv_claims import claim_of
from workers.fleet_presence import engine_capacity_of

LOOK_AGAIN_S = 1.0  # how often an engine that reported no KV capacity yet is asked again


class KvGate:
    def __init__(self, capacity: Callable[[], tuple[int, int, int]], overcommit: float = 1.0, *,
                 queued: Callable[[str], bool] = lambda request_id: True):
        """`capacity`: the engine's (KV-cache tokens requests can hold, max model length,
        tokens a block), 0 where unknown; `queued`: whether a request is still in the
        worker's queue."""
        if not overcommit > 0:
            raise ValueError(f"kv_overcommit must be above 0, not {overcommit!r}")
        self._capacity, self._overcommit, self._queued = capacity, overcommit, queued
        self._known: tuple[int, int, int] = (0, 0, 0)
        self._looked_at = float("-inf")
        self._held: dict[str, int] = {}  # request id -> claim, of what the worker runs
        self._total = 0
        self._waiting: tuple[str, int] | None = None

    @classmethod
    def of_engine(cls, engine, running: int, overcommit: float, *, queued: Callable[[str], bool]) -> "KvGate":
        """The gate of a worker's engine, whose capacity the worker's heartbeats also report."""
        def capacity() -> tuple[int, int, int]:
            announced, figures = engine_capacity_of(engine, running), engine.kv_figures()
            holdable = max(0, announced.kv_cache_tokens - figures.reserved_tokens)
            return holdable, announced.max_model_len, figures.block_tokens
        return cls(capacity, overcommit, queued=queued)

    def _engine(self) -> tuple[int, int, int]:
        # Known once the engine says (after its start); until then, asked now and then.
        if self._known[0] <= 0 and time.monotonic() - self._looked_at >= LOOK_AGAIN_S:
            self._looked_at = time.monotonic()
            self._known = self._capacity()
        return self._known

    @property
    def admits(self) -> int:
        """The claims the worker starts work within; 0: its engine reports no KV capacity."""
        return int(self._engine()[0] * self._overcommit)

    @property
    def held(self) -> int:
        return self._total

    def claim(self, req) -> int:
        """A request's claim on this engine (`GenerationRequested`), capped at its max length,
        in the whole blocks it would hold."""
        _, max_len, block = self._engine()
        tokens = claim_of(req.input_tokens, req.max_output_tokens, max_len if max_len > 1 else None)
        return -(-tokens // block) * block if block > 0 else tokens

    def fits(self, request_id: str, claim: int, *, wait: bool = True) -> bool:
        """Whether the request may start now. With `wait`, the first that may not is kept
        (see the module), and the others must fit beside it."""
        admits = self.admits
        if admits <= 0:
            return True
        waiting = self._waiting
        if waiting is not None and waiting[0] != request_id and not self._queued(waiting[0]):
            waiting = self._waiting = None  # it left the queue without starting here
        beside = waiting[1] if waiting is not None and waiting[0] != request_id else 0
        if not self._held and not beside:
            return True  # idle: it runs, alone if it must
        if self._total + claim + beside <= admits:
            return True
        if wait and waiting is None:
            self._waiting = (request_id, claim)
        return False

    def started(self, request_id: str, claim: int) -> None:
        if self._waiting is not None and self._waiting[0] == request_id:
            self._waiting = None
        if request_id not in self._held:
            self._held[request_id] = claim
            self._total += claim

    def finished(self, request_id: str) -> None:
        self._total -= self._held.pop(request_id, 0)
