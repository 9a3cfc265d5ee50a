"""Events of the worker fleet: each worker announces itself, heartbeats its load, and
says when it drains and leaves. They live on `topics.FLEET` (keyed by worker id, bounded
retention), so a heartbeat repeats what the worker is and what it can hold: a reader that
starts anywhere in the topic knows the whole fleet after one heartbeat interval.
"""
from __future__ import annotations

from pydantic import Field

from models.event_types import Payload, event


def _zero(value: int) -> bool:
    return value == 0


class Capacity(Payload):
    """What one worker's engine can hold at once."""

    max_seqs: int = Field(gt=0)
    kv_cache_tokens: int = Field(ge=0)
    max_model_len: int = Field(gt=0)


class Announcement(Payload):
    """What a worker is, as its join says and every heartbeat repeats."""

    worker_id: str
    pool: str
    model_revision: str
    engine_config_hash: str  # of the engine the worker actually loaded
    host: str
    pid: int = Field(ge=0)
    capacity: Capacity
    heartbeat_interval_ms: int = Field(gt=0)


@event("WorkerJoined")
class WorkerJoined(Announcement):
    """A worker is ready to take work."""


@event("WorkerHeartbeat")
class WorkerHeartbeat(Announcement):
    """The worker's load now, with its announcement repeated (see the module doc)."""

    seq: int = Field(ge=0)  # increases with each heartbeat of one worker process
    draining: bool = False  # repeated too, so a late reader does not send work to a draining worker
    running: int = Field(ge=0)
    waiting: int = Field(ge=0)
    free_slots: int = Field(ge=0)
    kv_cache_usage: float = Field(ge=0.0, le=1.0)
    output_tokens_per_s: float = Field(ge=0.0)
    # The engine's KV cache as it allocated it: tokens of it in use now, and running totals
    # since the worker started of sequences it preempted (evicted for want of KV blocks) and
    # of prompt tokens looked up in, and found in, its prefix cache. Zero from engines that
    # do not say; a zero is left out of the bytes, so a heartbeat without them encodes as it
    # did before they existed.
    kv_tokens_used: int = Field(default=0, ge=0, exclude_if=_zero)
    preemptions: int = Field(default=0, ge=0, exclude_if=_zero)
    prefix_cache_queries: int = Field(default=0, ge=0, exclude_if=_zero)
    prefix_cache_hits: int = Field(default=0, ge=0, exclude_if=_zero)
    # The partitions of each work topic the worker owns now (its consumer group's share), so
    # admission can place work by worker (`pipelines.admission.placement`); absent (and left out of
    # the bytes) from workers that do not say.
    work_partitions: dict[str, list[int]] | None = Field(default=None, exclude_if=lambda v: v is None)


@event("WorkerDraining")
class WorkerDraining(Payload):
    """The worker takes no new work; it finishes what it runs, then leaves."""

    worker_id: str
    reason: str


@event("WorkerLeft")
class WorkerLeft(Payload):
    worker_id: str
    reason: str
    exit_code: int | None = None
