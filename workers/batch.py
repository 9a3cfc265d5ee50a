"""The batch pool: Celery workers running chunks, separate processes from the
interactive pool, so batches never compete for an interactive engine.

    celery -A workers.batch.celery_app worker -Q batch -c 1 --pool prefork
    (or: ledgerlm serve batch-worker; with --pool NAME, only the chunks of tenants
    assigned that dedicated pool, from the queue `batch.pool.NAME`)

Celery imports this module as its entrypoint, so the app is configured from `Settings`
(the environment) when Celery first reads its configuration, not at import. Each worker
process keeps its own engine, event log and object store: made on first use after the
fork (never inherited from the parent) and kept warm across tasks.

Delivery: acknowledged late and rejected back to the queue when the worker process dies,
so a chunk whose worker was killed runs again; errors retry with exponential backoff,
and after the last retry the chunk is reported failed. An outage of the object store or
the log is waited out in place with backoff, within the chunk's time limit, and uses up
no retry: the chunk goes on where it stood when the service is back. A chunk's work is
idempotent (one part at a derived key), so running it twice writes the same object once.
"""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

from celery import Celery, signals
from celery.exceptions import SoftTimeLimitExceeded

from models.settings import Settings
from pipelines.batch.queue import TASK_NAME
from pipelines.bootstrap import Bootstrap
from pipelines.outage import Readiness, ride_out
from workers.batch_engine import EngineMismatch, EngineSlot
from workers.batch_runner import ChunkTask, report_failure, run_chunk

logger = logging.getLogger(__name__)
MAX_RETRIES = 3
BACKOFF_S = 2.0

celery_app = Celery("ledgerlm-batch", set_as_current=False)


@celery_app.on_configure.connect
def _configure(sender: Celery, **_) -> None:
    sender.conf.update(Bootstrap(Settings()).celery_config())


@dataclass
class _Process:
    settings: Settings
    store: object
    log: object
    engines: EngineSlot
    worker_id: str
    readiness: Readiness


_process: _Process | None = None  # this worker process's resources; see `resources()`
_readiness: Readiness | None = None  # whether chunks can reach the store and the log; see `readiness()`


def readiness() -> Readiness:
    """This worker's readiness (`ledgerlm_ready{component="batch-worker"}`). Only the child
    that runs chunks marks it; it is made once, so the metrics served by that child and
    the chunks it runs share it whichever of them asks first after the fork."""
    global _readiness
    if _readiness is None:
        _readiness = Readiness("batch-worker", stall_s=None)  # a long chunk is work, not a stall
    return _readiness


def resources() -> _Process:
    """The calling process's store, log and engine slot, made on first use."""
    global _process
    if _process is None or _process.worker_id != _worker_id():
        settings = Settings()
        platform = Bootstrap(settings)
        _process = _Process(settings, platform.object_store(), platform.event_log(create_topics=False),
                            EngineSlot({"max_num_seqs": settings.engine_max_seqs, "kv_cache_gb": settings.kv_cache_gb}),
                            _worker_id(), readiness())
    return _process


def _worker_id() -> str:
    pool = os.environ.get("LEDGERLM_BATCH_POOL")  # set by `ledgerlm serve batch-worker --pool NAME`
    name = f"batch.{pool}" if pool else "batch"
    return f"{name}@{socket.gethostname()}:{os.getpid()}"


@signals.worker_process_init.connect
def _forget_parent_resources(**_) -> None:
    global _process
    _process = None  # sockets and engines do not survive a fork; the child makes its own


@signals.worker_process_shutdown.connect
def _close_resources(**_) -> None:
    if _process is not None:
        _process.engines.drop()
        _process.log.close()


@celery_app.task(name=TASK_NAME, bind=True, max_retries=MAX_RETRIES, acks_late=True, reject_on_worker_lost=True)
def run_chunk_task(self, task: dict) -> str:
    chunk = ChunkTask(**task)
    proc = resources()
    patience = proc.settings.batch_chunk_time_limit_s  # the soft time limit ends a longer wait first

    def attempt() -> str:
        return run_chunk(chunk, store=proc.store, log=proc.log, engines=proc.engines, worker_id=proc.worker_id,
                         attempt=self.request.retries + 1, readiness=proc.readiness, store_patience_s=patience)
    try:
        return ride_out(attempt, readiness=proc.readiness, deadline_s=patience)
    except EngineMismatch as exc:
        report_failure(proc.log, chunk, "engine_mismatch", str(exc), proc.worker_id)
        return "failed"
    except Exception as exc:
        if isinstance(exc, SoftTimeLimitExceeded):
            exc = TimeoutError(f"the chunk ran past its time limit of {proc.settings.batch_chunk_time_limit_s}s")
        # The engine may hold half-run requests after an error; the next attempt starts clean.
        proc.engines.drop()
        if self.request.retries >= MAX_RETRIES:
            logger.exception("chunk %s/%s failed for good", chunk.batch_id, chunk.chunk_index)
            report_failure(proc.log, chunk, "chunk_failed", f"{type(exc).__name__}: {exc}", proc.worker_id)
            return "failed"
        logger.warning("chunk %s/%s failed (%s); retrying", chunk.batch_id, chunk.chunk_index, exc)
        raise self.retry(exc=exc, countdown=BACKOFF_S * 2 ** self.request.retries)
