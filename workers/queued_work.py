"""What a pool worker holds in its fair queue, and how many sequences its engine runs."""
from __future__ import annotations

from typing import NamedTuple

from models.events import Envelope
from pipelines.eventlog import TopicPartition
from workers.engine import InferenceEngine
from workers.fair_share import Item


class QueuedWork(NamedTuple):
    """What a queued `Item` holds: the work's `GenerationQueued` and where it was read
    (offset -1 for work offered by admission, which was never on a work topic)."""

    topic: str
    partition: int
    offset: int
    queued: Envelope

    @property
    def topic_partition(self) -> TopicPartition:
        return self.topic, self.partition

    @property
    def request_id(self) -> str:
        return self.queued.payload.request.request_id


WorkItem = Item[QueuedWork]


def engine_capacity(engine: InferenceEngine) -> int:
    """Sequences the engine runs at once (vLLM's max_num_seqs; the port's `max_num_seqs`)."""
    return max(1, engine.max_num_seqs())
