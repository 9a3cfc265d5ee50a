"""Admission's metrics: what the processor decided and settled, and the autoscaling
signals per pool and revision (`pipelines.admission.signals`), served by
`pipelines.metrics.serve_metrics` like every other process's set."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Iterable

from prometheus_client import CollectorRegistry, Counter

from models import topics
from models.events_generation import BudgetReserved, GenerationAdmitted, GenerationRejected, UsageSettled
from models.settings import Settings
from pipelines.admission.signals import Demand, pool_of, signal_rows
from pipelines.metrics import Gauges


class AdmissionMetrics:
    """What one admission processor decided and settled. Its `written` is the processor's
    `on_written`: it counts the outputs of each unit once that unit is committed. Once it
    `follow`s the processor, the autoscaling signals per pool and revision too
    (`pipelines.admission.signals`): queue depth, oldest queued age, KV pressure and
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
