"""The service admission assumes and measures for one (pool, revision): the floors assumed
before anything is measured (`Floors`, `Settings.admission_floor_*`), the rates measured from
what admission reads (`ServiceRates`: queue time from starts, time to first token and time
per output token from completed generations' timings, the whole service time), smoothed, and
the quota's estimate of the least a request takes (`ServiceEstimate`, `models.quota`).

Capacity-aware admission (`pipelines.admission.capacity`) decides with them; a restarted (or
rebalanced) processor reads them back from the log (`pipelines.admission.service_readback`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from models.events_generation import GenerationCompleted
from models.quota import min_service_ms


def _smooth(old: float | None, new: float, smoothing: float) -> float:
    return new if old is None else old + smoothing * (new - old)


@dataclass
class ServiceRates:
    """Service measured for one (pool, revision), smoothed; None until first seen. Rebuilt
    from the log with the book (`pipelines.admission.service_readback`)."""

    smoothing: float = 0.2
    queue_ms: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None  # per output token after the first, per sequence
    service_ms: float | None = None  # from start to end

    def observe_start(self, queued_ms: int) -> None:
        self.queue_ms = _smooth(self.queue_ms, queued_ms, self.smoothing)

    def observe_completed(self, done: GenerationCompleted) -> None:
        t = done.timings
        self.service_ms = _smooth(self.service_ms, t.duration_ms, self.smoothing)
        if t.ttft_ms is not None:
            self.ttft_ms = _smooth(self.ttft_ms, t.ttft_ms, self.smoothing)
            if done.output_tokens >= 2:
                per_token = max(0, t.duration_ms - t.ttft_ms) / (done.output_tokens - 1)
                self.tpot_ms = _smooth(self.tpot_ms, per_token, self.smoothing)


@dataclass(frozen=True)
class Floors:
    """The least an engine takes, before anything is measured. The defaults are far below
    any real engine, so only hopeless deadlines are refused; set them per deployment
    (`Settings.admission_floor_first_token_ms`, `..._ms_per_output_token`) to refuse sooner
    what a cold admission would otherwise queue to miss its deadline."""

    first_token_ms: float = 5.0
    ms_per_output_token: float = 0.5

    def __post_init__(self) -> None:
        for name in ("first_token_ms", "ms_per_output_token"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"service floor {name} must be a finite number of ms, 0 or more, not {value!r}")

    @classmethod
    def from_settings(cls, settings) -> "Floors":
        return cls(first_token_ms=settings.admission_floor_first_token_ms,
                   ms_per_output_token=settings.admission_floor_ms_per_output_token)


@dataclass
class ServiceEstimate:
    """How long serving takes at best, for the quota's deadline check (`models.quota`), made
    before the fleet's is: the floors, plus the queue times workers report
    (`GenerationStarted.queued_ms`) in this processor's partitions, smoothed. Read back with
    the rates when the book is rebuilt."""

    first_token_ms: float = Floors.first_token_ms
    ms_per_output_token: float = Floors.ms_per_output_token
    queue_ms: float = 0.0
    smoothing: float = 0.2

    @classmethod
    def from_floors(cls, floors: Floors) -> "ServiceEstimate":
        return cls(first_token_ms=floors.first_token_ms, ms_per_output_token=floors.ms_per_output_token)

    def observe_queue(self, queued_ms: int) -> None:
        self.queue_ms += self.smoothing * (queued_ms - self.queue_ms)

    def min_service_ms(self, max_output_tokens: int) -> int:
        return min_service_ms(max_output_tokens, queue_ms=int(self.queue_ms), first_token_ms=self.first_token_ms,
                              ms_per_output_token=self.ms_per_output_token)
