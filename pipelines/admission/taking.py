"""Admitting and taking in one unit: a pool worker in the same process may be given as the
admission processor's `taker`. Each admitted request is offered to it; when its engine has
a free slot and nothing waits in its queue, it starts the generation at once, and the
request's `GenerationStarted` replaces its `GenerationQueued` in the admission's own commit.
The work never reaches a work topic, so no other worker can see it, let alone take it, and
the first token waits for one commit instead of two. The generation writes nothing until
that commit is through (`Taking.resolve`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Protocol

from models import topics
from models.events import Envelope
from models.events_generation import GenerationQueued
from models.topics import Topic
from pipelines.publish import Outputs

logger = logging.getLogger(__name__)


@dataclass
class Taking:
    """Admitted work a taker started: `started` goes out in the admission's commit, and
    `resolve` is called once, True when that commit is through (the generation may write
    from then on) and False when it is not (the generation must leave without a trace)."""

    started: Envelope
    resolve: Callable[[bool], None]


class Taker(Protocol):
    def offer(self, queued: Envelope, work_topic: Topic) -> Taking | None:
        """Starts `queued` now if it may, or returns None and leaves it to the work topic."""


class Takings:
    """What the taker (None: there is none) started of the unit being decided, each resolved
    once with that unit's commit."""

    def __init__(self, taker: Taker | None):
        self.taker = taker
        self._pending: list[Taking] = []

    def offer(self, outputs: Outputs) -> Outputs:
        """Queued work the taker starts goes out as its `GenerationStarted` instead."""
        if self.taker is None:
            return outputs
        out: Outputs = []
        for topic, env in outputs:
            taking = self.taker.offer(env, topic) if isinstance(env.payload, GenerationQueued) else None
            if taking is None:
                out.append((topic, env))
            else:
                self._pending.append(taking)
                out.append((topics.OUTCOMES, taking.started))
        return out

    def resolve(self, committed: bool) -> None:
        """Tells each take whether the unit it went out in was committed."""
        pending, self._pending = self._pending, []
        for taking in pending:
            try:
                taking.resolve(committed)
            except Exception:  # one taker's failure must not keep the others waiting
                logger.exception("resolving a take of %s failed", taking.started.payload.request_id)
