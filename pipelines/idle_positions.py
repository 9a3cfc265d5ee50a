"""When a consumer commits positions that decided nothing.

A processor commits its input positions with the outputs they led to, as one unit. Some
records lead to nothing (admission reading a generation's start, a worker reading back its
own take). Committing their positions at once costs a unit of its own (on Kafka a
transaction: five requests and its markers) for nothing: read again after a crash, such a
record changes nothing again. So those positions ride with the next unit that writes
something, or are committed on their own once they have waited `every_s`.
"""
from __future__ import annotations

import time


class IdlePositions:
    def __init__(self, every_s: float = 1.0):
        self.every_s = every_s
        self._since: float | None = None  # since when moved positions wait for a unit

    def due(self, moved: bool) -> bool:
        """Whether to commit now a unit with no outputs; `moved`: positions moved since the
        last unit (or the caller cannot tell, and some records came in)."""
        now = time.monotonic()
        if moved and self._since is None:
            self._since = now
        return self._since is not None and now - self._since >= self.every_s

    def saved(self) -> None:
        """The positions were committed, or dropped (a seek to the committed ones)."""
        self._since = None
