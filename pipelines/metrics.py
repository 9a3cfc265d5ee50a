"""Prometheus metrics of the platform's processes that serve no HTTP of their own:
admission, the projector and the batch dispatcher (the pool worker's are in
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
from datetime import datetime, timezone
from typing import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, CollectorRegistry, Counter, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from models import topics
from models.events_generation import BudgetReserved, GenerationAdmitted, GenerationRejected, UsageSettled
from models.settings import Settings
from pipelines.autoscaling_signals import Demand, pool_of, signal_rows

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


# -- admission ----------------------------------------------------------------------------

class AdmissionMetrics:
    """What one admission processor decided and settled. Its `written` is the processor's
    `on_written`: it counts the outputs of each unit once that unit is committed. Once it
    `follow`s the processor, the autoscaling signals per pool and revision too
    (`pipelines.autoscaling_signals`): queue depth, oldest queued age, KV pressure and
    desired replicas at the utilization `ceiling`, with arrivals over `window_s`."""

    def __init__(self, *, ceiling: float = 0.7, window_s: float = 60.0) -> None:
        if not 0 < ceiling <= 1:
            raise ValueError(f"the utilization ceiling must be above 0 and at most 1, not {ceiling}")
        self.ceiling = ceiling
        self.demand = Demand(window_s)
        r = self.registry = CollectorRegistry()
        self.decisions = Counter("ledgerlm_admission_processor_decisions",
                                 "Requests the admission processor decided, by outcome and reason (written to the log)",
                                 ["outcome", "reason"], registry=r)
        self.settlements = Counter("ledgerlm_settlements", "Reservations settled, by terminal status",
                                   ["status"], registry=r)
        self.decisions.labels("admitted", "")  # present from the start, at zero

    @classmethod
    def from_settings(cls, settings: Settings) -> "AdmissionMetrics":
        return cls(ceiling=settings.autoscale_utilization_ceiling, window_s=settings.autoscale_window_s)

    def follow(self, processor) -> "AdmissionMetrics":
        """Open reservations and the autoscaling signals, read from the processor at scrape time."""
        self.registry.register(Gauges(lambda: [
            ("ledgerlm_open_reservations", "Reservations admitted and not yet settled, in this processor's partitions",
             {}, len(processor.book.open))]))
        self.registry.register(Gauges(lambda: signal_rows(processor, self.demand, ceiling=self.ceiling,
                                                          now=datetime.now(timezone.utc))))
        return self

    def written(self, outputs: Iterable[tuple[topics.Topic, object]]) -> None:
        revisions: dict[str, str] = {}  # request id -> revision, from its reservation in the same unit
        for topic, env in outputs:
            p = env.payload
            if topic.name != topics.LEDGER.name:
                continue  # a rejection goes to the stream too: counted once, from the ledger
            if isinstance(p, BudgetReserved):
                self.decisions.labels("admitted", "").inc()
                revisions[p.request_id] = p.model_revision
            elif isinstance(p, GenerationAdmitted):  # work for a pool's workers (a cache answer is none)
                revision = revisions.get(p.request_id, "")
                if (pool := pool_of(p.work_topic, revision)) is not None:
                    self.demand.admitted(p.request_id, (pool, revision))
            elif isinstance(p, GenerationRejected):
                self.decisions.labels("rejected", p.reason).inc()
            elif isinstance(p, UsageSettled):
                self.settlements.labels(p.terminal_status).inc()
                self.demand.settled(p.request_id, p.terminal_status, p.input_tokens, p.output_tokens)


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
