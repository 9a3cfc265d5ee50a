"""Prometheus metrics of a Celery batch worker: chunks it runs, and how they ended.

Chunks run in the worker's child process (prefork, `-c 1`), so that is where they are
counted and served from: importing this module (`celery worker --include
workers.batch_metrics`, as `ledgerlm serve batch-worker` does) connects Celery's
signals, and each child, once forked, serves `/metrics` on `LEDGERLM_METRICS_PORT` (0:
none), with `ledgerlm_ready` (0 while the store or the log is away and a chunk waits). A
child that dies frees its port for the one that replaces it; counts start again from
zero, which Prometheus reads as a counter reset.
"""
from __future__ import annotations

import logging
import threading

from celery import signals
from prometheus_client import CollectorRegistry, Counter, Gauge

from models.settings import Settings
from pipelines.batch.queue import TASK_NAME
from pipelines.metrics import MetricsServer, serve_metrics
from pipelines.outage import readiness_registry
from workers.batch import readiness

logger = logging.getLogger(__name__)
OUTCOMES = ("completed", "skipped", "failed", "retried")


class BatchWorkerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.running = Gauge("ledgerlm_batch_worker_chunks_running", "Chunks this worker process is running",
                             registry=r)
        self.ended = Counter("ledgerlm_batch_worker_chunks", "Chunk runs of this worker process, by how they ended "
                             "(retried: an attempt failed and the chunk was queued again)", ["outcome"], registry=r)
        for outcome in OUTCOMES:
            self.ended.labels(outcome)

    def started(self) -> None:
        self.running.inc()

    def finished(self, state: str, retval) -> None:
        self.running.dec()
        if state == "RETRY":
            self.ended.labels("retried").inc()
        elif state == "SUCCESS" and retval in ("completed", "skipped", "failed"):
            self.ended.labels(retval).inc()
        else:
            self.ended.labels("failed").inc()


_metrics: BatchWorkerMetrics | None = None  # this worker process's; made in each child after the fork
_server: MetricsServer | None = None
_lock = threading.Lock()


@signals.worker_process_init.connect
def _serve(**_) -> None:
    global _metrics, _server
    with _lock:
        _metrics = BatchWorkerMetrics()
        try:
            _server = serve_metrics(Settings(), _metrics.registry, readiness_registry(readiness()))
        except OSError:  # the port is taken: run chunks unobserved rather than not at all
            logger.exception("batch worker metrics not served")


@signals.worker_process_shutdown.connect
def _stop(**_) -> None:
    if _server is not None:
        _server.close()


@signals.task_prerun.connect
def _prerun(sender=None, **_) -> None:
    if _metrics is not None and getattr(sender, "name", None) == TASK_NAME:
        _metrics.started()


@signals.task_postrun.connect
def _postrun(sender=None, state: str | None = None, retval=None, **_) -> None:
    if _metrics is not None and getattr(sender, "name", None) == TASK_NAME:
        _metrics.finished(state or "", retval)
