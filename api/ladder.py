"""The overload ladder's state in one API: which revisions of a router alias were refused
for capacity lately (shed, or no live worker), and so cool down for `COOLDOWN_S`, and which
fallback a refused request goes to next. The ladder's order: a semantic cache hit needs no
engine at all (it is looked up before capacity is); then a downgrade to the router's next
smaller revision; then admission's own shedding, which refuses normal priority before
high (429/503 with Retry-After)."""
from __future__ import annotations

import threading
import time

COOLDOWN_S = 5.0


class Ladder:
    def __init__(self, *, cooldown_s: float = COOLDOWN_S, clock=time.monotonic):
        self._cooldown_s, self._clock = cooldown_s, clock
        self._lock = threading.Lock()
        self._until: dict[tuple[str, str], float] = {}  # (alias, revision) -> cooling until
        self.fallbacks_taken: dict[tuple[str, str], int] = {}  # (alias, revision fallen back to) -> count

    def refused(self, alias: str, revision: str) -> None:
        with self._lock:
            self._until[alias, revision] = self._clock() + self._cooldown_s

    def cooling(self, alias: str) -> frozenset[str]:
        now = self._clock()
        with self._lock:
            return frozenset(rev for (a, rev), until in self._until.items() if a == alias and until > now)

    def fallback(self, registry, alias: str, tried: list[str], fleet, *, pool: str) -> str | None:
        """The next of the alias's router fallbacks not yet tried, pinnable, and served by a
        live worker now; None when there is none (the refusal stands)."""
        router = registry.routers.get(alias)
        if router is None:
            return None
        for revision in router.fallbacks:
            if revision in tried or registry.pinnable(revision) is None:
                continue
            if fleet is not None and not fleet.serves_soon(pool, revision):
                continue
            with self._lock:
                self.fallbacks_taken[alias, revision] = self.fallbacks_taken.get((alias, revision), 0) + 1
            return revision
        return None

    def state(self, alias: str) -> dict:
        now = self._clock()
        with self._lock:
            return {"cooling": {rev: round(until - now, 3) for (a, rev), until in sorted(self._until.items())
                                if a == alias and until > now},
                    "fallbacks_taken": {rev: n for (a, rev), n in sorted(self.fallbacks_taken.items()) if a == alias}}
