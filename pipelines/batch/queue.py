"""The `ChunkQueue` port: how the dispatcher hands a chunk to the batch pool.

`CeleryChunkQueue` sends the task by name, so this side never imports the worker (and
never vLLM). A task may be sent twice (the dispatcher sends before it commits, and
redoes uncommitted work after a crash); tasks are idempotent per (tenant, batch, chunk).

Dedicated pools: a task naming a `pool` goes to that pool's own queue (`pool_queue`),
which only `ledgerlm serve batch-worker --pool NAME` consumes; the shared workers never
see it. Whether a pool has a live batch worker is asked of the workers themselves
(Celery's remote control, bounded by a timeout and cached); it only decides what the
batch's status says, never where a chunk goes.
"""
from __future__ import annotations

import logging
import time
from typing import Protocol

TASK_NAME = "ledgerlm.batch.run_chunk"
PRESENCE_TIMEOUT_S = 0.5  # how long a look for a pool's workers waits for their replies
PRESENCE_TTL_S = 5.0  # how long an answer is reused before looking again
logger = logging.getLogger(__name__)


class ChunkQueue(Protocol):
    def enqueue(self, task: dict) -> None: ...

    def close(self) -> None: ...


def pool_queue(queue: str, pool: str | None) -> str:
    """The Celery queue of a pool's batch chunks: `queue` (the shared one) for no pool,
    `<queue>.pool.<pool>` for a dedicated pool."""
    return f"{queue}.pool.{pool}" if pool else queue


def celery_config(broker_url: str, queue: str, *, chunk_time_limit_s: float) -> dict:
    """Celery settings shared by the dispatcher (producer) and the batch workers."""
    options: dict = {}
    if broker_url.startswith(("redis://", "rediss://")):
        # An unacknowledged task goes back to the queue after this long; it must outlast a
        # chunk's retries, or a slow chunk would be handed to a second worker meanwhile.
        options["visibility_timeout"] = int(chunk_time_limit_s * 4 + 300)
    # The embedded (SQLAlchemy) broker is polled once a second; kombu hands its transport
    # options to create_engine, so that interval cannot be shortened here.
    return {
        "broker_url": broker_url,
        "broker_transport_options": options,
        "broker_connection_retry_on_startup": True,
        "task_default_queue": queue,
        "task_routes": {TASK_NAME: {"queue": queue}},
        "task_ignore_result": True,  # results travel on the event log, not a result backend
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,  # acknowledged after the chunk ran: a lost worker's chunk is redone
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,  # a worker holds one chunk at a time, others stay queued
        "task_soft_time_limit": chunk_time_limit_s,
        "task_time_limit": chunk_time_limit_s + 60,
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
        "worker_enable_remote_control": broker_url.startswith(("redis://", "rediss://", "amqp://")),
    }


class CeleryChunkQueue:
    def __init__(self, broker_url: str, queue: str, *, chunk_time_limit_s: float):
        from celery import Celery

        self.queue = queue
        self._app = Celery("ledgerlm-dispatcher", set_as_current=False)
        self._app.conf.update(celery_config(broker_url, queue, chunk_time_limit_s=chunk_time_limit_s))

        self._seen: dict[str, tuple[float, bool | None]] = {}  # pool -> (when looked, live)

    def enqueue(self, task: dict) -> None:
        self._app.send_task(TASK_NAME, kwargs={"task": task}, queue=pool_queue(self.queue, task.get("pool")),
                            task_id=f"{task['batch_id']}.{task['chunk_index']}")

    def has_worker(self, pool: str) -> bool | None:
        """Whether some live batch worker consumes the pool's queue; None when that cannot
        be known (a broker without remote control, or the look failed)."""
        now = time.monotonic()
        looked = self._seen.get(pool)
        if looked is not None and now - looked[0] < PRESENCE_TTL_S:
            return looked[1]
        live = self._look(pool_queue(self.queue, pool))
        self._seen[pool] = (now, live)
        return live

    def _look(self, queue: str) -> bool | None:
        if not self._app.conf.worker_enable_remote_control:
            return None
        try:
            replies = self._app.control.inspect(timeout=PRESENCE_TIMEOUT_S).active_queues() or {}
        except Exception as exc:  # noqa: BLE001 - a failed look says nothing either way
            logger.warning("could not ask the batch workers which queues they consume: %s", exc)
            return None
        return any(q.get("name") == queue for queues in replies.values() for q in queues or ())

    def close(self) -> None:
        self._app.close()
