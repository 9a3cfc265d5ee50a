"""The `ChunkQueue` port: how the dispatcher hands a chunk to the batch pool.

`CeleryChunkQueue` sends the task by name, so this side never imports the worker (and
never vLLM). A task may be sent twice (the dispatcher sends before it commits, and
redoes uncommitted work after a crash); tasks are idempotent per (tenant, batch, chunk).
"""
from __future__ import annotations

from typing import Protocol

TASK_NAME = "ledgerlm.batch.run_chunk"


class ChunkQueue(Protocol):
    def enqueue(self, task: dict) -> None: ...

    def close(self) -> None: ...


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

    def enqueue(self, task: dict) -> None:
        self._app.send_task(TASK_NAME, kwargs={"task": task}, queue=self.queue,
                            task_id=f"{task['batch_id']}.{task['chunk_index']}")

    def close(self) -> None:
        self._app.close()
