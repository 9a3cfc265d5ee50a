"""Prometheus metrics of the platform's processes that serve no HTTP of their own:
admission (its set is `pipelines.admission.metrics`), the projector and the batch dispatcher (the pool worker's are in
`workers.metrics`; the API serves its own at `GET /metrics`, see `api.metrics`).

`serve_metrics` serves prometheus_client's exposition (with `/healthz` and `/readyz`) on `settings.metrics_port`
(`LEDGERLM_METRICS_PORT`, 0: none, the default; one port per process, so each process
that is scraped is given its own). It serves the process's registry and prometheus_client's
global one, where the process collectors (CPU, memory, open files) and vLLM's own stat
logger register.

Each set of metrics has its own registry (no module globals). Counters count what was
written to the log, never a decision a failed unit threw away; gauges of state are read
at scrape time from the component itself, so they cost nothing between scrapes.
Labels are pools, revisions, reasons and statuses: never tenants, ids or text.
"""
from __future__ import annotations

import json
import logging
import threading
from typing import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from models.settings import Settings

logger = logging.getLogger(__name__)


class MetricsServer:
    """prometheus_client's exposition of `registries` and the global one at `/metrics`,
    beside `/healthz` (the process serves) and `/readyz`: 200 while `ready()` says every
    dependency answers (e.g. a worker's engine), 503 naming what does not otherwise."""

    def __init__(self, *registries: CollectorRegistry, port: int, host: str = "127.0.0.1",
                 ready: Callable[[], dict[str, bool]] | None = None):
        served = CollectorRegistry()
        for registry in registries:
            served.register(registry)
        served.register(REGISTRY)  # process collectors, and vLLM's own where an engine runs here
        self._server = make_server(host, port, _routed(make_wsgi_app(served), ready), ThreadingWSGIServer,
                                   handler_class=_Quiet)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()
        self.port = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - a scrape every few seconds is not news
        pass


def _routed(metrics_app, ready):
    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/health"):
            return _json(start_response, 200, {"status": "ok"})
        if path == "/readyz":
            try:
                checks = ready() if ready is not None else {}
            except Exception:  # noqa: BLE001 - a check that fails is a dependency not ready
                logger.exception("readiness check failed")
                checks = {"check": False}
            ok = all(checks.values())
            return _json(start_response, 200 if ok else 503,
                         {"status": "ready" if ok else "not_ready", "checks": checks})
        return metrics_app(environ, start_response)
    return app


def _json(start_response, status: int, body: dict) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(f"{status} {'OK' if status == 200 else 'Service Unavailable'}",
                   [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def serve_metrics(settings: Settings, *registries: CollectorRegistry,
                  ready: Callable[[], dict[str, bool]] | None = None) -> MetricsServer | None:
    """Serves `/metrics` (and `/healthz`, `/readyz`) on the settings' port; None when no port is set."""
    if not settings.metrics_port:
        return None
    server = MetricsServer(*registries, port=settings.metrics_port, host=settings.metrics_host, ready=ready)
    logger.info("metrics at http://%s:%d/metrics", settings.metrics_host, server.port)
    return server


class Gauges(Collector):
    """Gauges read at scrape time: `read()` yields (name, help, {label: value}, value)."""

    def __init__(self, read: Callable[[], Iterable[tuple[str, str, dict[str, str], float]]]):
        self._read = read

    def collect(self):
        families: dict[str, GaugeMetricFamily] = {}
        for name, help_text, labels, value in self._read():
            family = families.get(name)
            if family is None:
                family = families[name] = GaugeMetricFamily(name, help_text, labels=list(labels))
            family.add_metric(list(labels.values()), value)
        return list(families.values())


# -- projector ----------------------------------------------------------------------------

def projector_metrics(runner) -> CollectorRegistry:
    """Lag behind the log per projection, in records, as of the runner's last look at the
    log's ends (it looks before every batch, and at least every half second when idle)."""
    registry = CollectorRegistry()
    registry.register(Gauges(lambda: [
        ("ledgerlm_projection_lag_records", "Records on the log a projection has not applied yet",
         {"projection": name}, float(records)) for name, records in runner.last_lag().items()]))
    return registry


# -- batch dispatcher ---------------------------------------------------------------------

CHUNK_STATUSES = ("pending", "queued", "running", "completed", "failed", "skipped")


def dispatcher_metrics(dispatcher) -> CollectorRegistry:
    """Chunks of the dispatcher's batches by status, and its open batches, from its book."""
    def read():
        batches = list(dispatcher.book.batches.values())  # one copy: the dispatcher's thread adds to it
        chunks = dict.fromkeys(CHUNK_STATUSES, 0)
        for batch in batches:
            for chunk in list(batch.chunks):
                chunks[chunk.status] = chunks.get(chunk.status, 0) + 1
        for status, count in chunks.items():
            yield ("ledgerlm_batch_chunks", "Chunks of the batches in this dispatcher's partitions, by status",
                   {"status": status}, float(count))
        yield ("ledgerlm_batches_open", "Batches not ended yet, in this dispatcher's partitions", {},
               float(sum(1 for b in batches if not b.terminal)))

    registry = CollectorRegistry()
    registry.register(Gauges(read))
    return registry
