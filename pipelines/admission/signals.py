"""What an autoscaler reads of one (pool, revision), from one admission processor: the work
it queued (depth, and the age of the oldest), KV pressure (its KV claims over the KV
capacity it admits at once), and a desired replica count.

The desired count is the capacity planner's arithmetic (`models.capacity_plan.replica_plan`)
applied to what admission measured lately:

    λ  admitted requests per second, over the last `window_s` (this processor's partitions)
    T  output tokens per completed request, smoothed
    D = λ × T                       demand, in output tokens per second
    C  sequences one replica holds: its slots (max sequences ÷ workers), or fewer where its
       KV cache (KV tokens ÷ workers) holds fewer requests of the recent size (input + T)
    P = T ÷ S                       output tokens per second of one sequence, S the smoothed
                                    start-to-end time of completed generations
    G = C × P                       goodput of one replica, every slot busy at the recent pace
    desired = ceil(D ÷ (G × ceiling)) + 1 spare, and never below 1 + 1

G is measured at the load the fleet ran lately, so batching's cost per sequence is in it;
a replica's throughput at partial load is not, or a fleet serving its demand would always
ask for more. Until something completed, G and T are unknown and the count holds what
serves (never below 1 + 1). With several admission processors each sees its partitions'
share of λ and of the KV claims: sum their demand and pressure (the recording rules of
infra/prometheus/rules.yml do).
"""
from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, Iterable

from models import topics
from models.capacity_plan import replica_plan
from models.fleet import PoolCapacity
from pipelines.admission.capacity import CapacityBook, Key

SPARE_REPLICAS = 1  # kept beyond the demand, so losing one replica leaves the demand served
SMOOTHING = 0.2
REMEMBERED = 100_000  # admitted requests awaiting settlement whose (pool, revision) is kept


def pool_of(work_topic: str, revision: str) -> str | None:
    """The pool whose work topic for `revision` is named `work_topic`; None for any other name."""
    prefix, suffix = "ledgerlm.work.", "." + topics.revision_slug(revision)
    if not (work_topic.startswith(prefix) and work_topic.endswith(suffix)):
        return None
    lane = work_topic[len(prefix):-len(suffix)]
    pool = topics.SHARED_POOL if lane.startswith("interactive-") else lane.removeprefix("dedicated-").rsplit("-", 1)[0]
    level = lane.rsplit("-", 1)[-1]
    return pool if topics.work_topic(pool, level, revision).name == work_topic else None


class Demand:
    """Arrivals per (pool, revision) over a sliding window, and the smoothed size of the
    requests that completed. Fed by admission's thread, read by scrapes."""

    def __init__(self, window_s: float = 60.0, *, clock: Callable[[], float] = time.monotonic):
        if not window_s > 0:
            raise ValueError(f"the arrival window must be above 0 s, not {window_s}")
        self.window_s, self._clock = window_s, clock
        self._started = clock()
        self._arrivals: dict[Key, deque[float]] = {}
        self._pending: OrderedDict[str, Key] = OrderedDict()
        self._output: dict[Key, float] = {}
        self._input: dict[Key, float] = {}
        self._lock = threading.Lock()

    def admitted(self, request_id: str, key: Key) -> None:
        with self._lock:
            self._arrivals.setdefault(key, deque()).append(self._clock())
            self._pending[request_id] = key
            while len(self._pending) > REMEMBERED:  # settled by another processor after a rebalance
                self._pending.popitem(last=False)

    def settled(self, request_id: str, status: str, input_tokens: int, output_tokens: int) -> None:
        with self._lock:
            key = self._pending.pop(request_id, None)
            if key is None or status != "completed":
                return
            for sizes, tokens in ((self._output, output_tokens), (self._input, input_tokens)):
                old = sizes.get(key)
                sizes[key] = tokens if old is None else old + SMOOTHING * (tokens - old)

    def keys(self) -> set[Key]:
        with self._lock:
            return set(self._arrivals) | set(self._output)

    def arrivals_per_s(self, key: Key) -> float:
        now = self._clock()
        with self._lock:
            times = self._arrivals.get(key)
            if not times:
                return 0.0
            while times and times[0] < now - self.window_s:
                times.popleft()
            count = len(times)
        # A processor started less than a window ago has seen only that long.
        return count / max(min(self.window_s, now - self._started), 1.0)

    def sizes(self, key: Key) -> tuple[float | None, float | None]:
        """(output, input) tokens of a completed request, smoothed; None before any."""
        with self._lock:
            return self._output.get(key), self._input.get(key)


@dataclass(frozen=True)
class ReplicaNeed:
    arrivals_per_s: float
    demand_tokens_per_s: float | None  # None until a request completed
    goodput_tokens_per_s: float | None  # of one replica; None until measured
    desired: int


def replica_need(capacity: PoolCapacity | None, *, arrivals_per_s: float, output_tokens: float | None,
                 input_tokens: float | None, service_ms: float | None, ceiling: float) -> ReplicaNeed:
    """The desired replicas of one (pool, revision), with the figures it came from."""
    least = 1 + SPARE_REPLICAS
    hold = max(least, capacity.workers if capacity is not None else 0)
    demand = None if output_tokens is None else arrivals_per_s * output_tokens
    goodput = _goodput(capacity, output_tokens, input_tokens, service_ms)
    if demand is None or goodput is None:
        return ReplicaNeed(arrivals_per_s, demand, goodput, hold)
    if demand <= 0:
        return ReplicaNeed(arrivals_per_s, demand, goodput, least)
    plan = replica_plan(peak_requests_per_s=arrivals_per_s, output_tokens_per_request=output_tokens,
                        per_replica_tokens_per_s=goodput, ceiling=ceiling, failures=SPARE_REPLICAS)
    return ReplicaNeed(arrivals_per_s, demand, goodput, max(least, plan.replicas))


def _goodput(capacity: PoolCapacity | None, output_tokens: float | None, input_tokens: float | None,
             service_ms: float | None) -> float | None:
    if capacity is None or capacity.workers <= 0 or capacity.max_seqs <= 0:
        return None
    if not output_tokens or not service_ms or service_ms <= 0:
        return None
    sequences = capacity.max_seqs / capacity.workers
    if capacity.kv_cache_tokens > 0:
        sequences = min(sequences, capacity.kv_cache_tokens / capacity.workers / (output_tokens + (input_tokens or 0)))
    goodput = sequences * output_tokens / (service_ms / 1000)
    return goodput if goodput > 0 and math.isfinite(goodput) else None


def kv_pressure(book: CapacityBook, key: Key) -> float | None:
    """The KV tokens claimed by the open work of (pool, revision) this processor admitted,
    over the claims admission admits at once there (`CapacityBook.kv_capacity`: the live
    workers' KV cache, lowered while they preempt, times the overcommit). At 1 admission
    queues or sheds for KV. None where the workers report no KV capacity."""
    capacity = book.kv_capacity(key)
    return book.claims(key) / capacity if capacity > 0 else None


Row = tuple[str, str, dict[str, str], float]


def signal_rows(processor, demand: Demand, *, ceiling: float, now) -> Iterable[Row]:
    """The gauges of one admission processor at `now` (a scrape)."""
    book = processor.capacity
    fleet = book.source if book.source is not None and book.source.complete_at is not None else None
    capacities = fleet.capacity() if fleet is not None else {}
    queues = book.queue_signals(now)
    rates = dict(book.rates)
    yield ("ledgerlm_autoscale_utilization_ceiling", "Share of a replica's goodput the desired replica count "
           "plans it to run at", {}, ceiling)
    for key in sorted(set(capacities) | set(queues) | demand.keys()):
        pool, revision = key
        labels = {"pool": pool, "revision": revision}
        depth, oldest = queues.get(key, (0, 0.0))
        yield ("ledgerlm_admission_queue_depth", "Work admission queued and no worker started yet", labels, depth)
        yield ("ledgerlm_admission_oldest_queued_age_seconds", "How long the oldest of that work has waited "
               "(0: none waits)", labels, oldest)
        capacity = capacities.get(key)
        if (pressure := kv_pressure(book, key)) is not None:
            yield ("ledgerlm_admission_kv_pressure", "KV tokens this processor's open work claims, over "
                   "the claims admitted at once (the live workers' KV cache times the overcommit)", labels, pressure)
        output, input_ = demand.sizes(key)
        rate = rates.get(key)
        need = replica_need(capacity, arrivals_per_s=demand.arrivals_per_s(key), output_tokens=output,
                            input_tokens=input_, service_ms=rate.service_ms if rate else None, ceiling=ceiling)
        yield ("ledgerlm_admission_arrivals_per_second", "Requests admitted per second, lately", labels,
               need.arrivals_per_s)
        if need.demand_tokens_per_s is not None:
            yield ("ledgerlm_admission_demand_output_tokens_per_second", "Output tokens per second the "
                   "admitted requests ask for: arrivals times the output of a completed request", labels,
                   need.demand_tokens_per_s)
        if need.goodput_tokens_per_s is not None:
            yield ("ledgerlm_replica_goodput_output_tokens_per_second", "Output tokens per second one replica "
                   "makes with every slot busy, at the recent pace", labels, need.goodput_tokens_per_s)
        yield ("ledgerlm_desired_replicas", "Replicas that serve the demand at the utilization ceiling, "
               "plus one spare", labels, need.desired)
    yield from _alias_rows(processor, capacities)


def _alias_rows(processor, capacities: dict[Key, PoolCapacity]) -> Iterable[Row]:
    """Live workers taking work for each alias's revision (and its rollout's candidate), in
    any pool. The registry is admission's, as of its last look at the admin topic."""
    if processor.capacity.source is None:
        return
    registry = processor.registry
    serving: dict[str, int] = {}
    for (_, revision), capacity in capacities.items():
        serving[revision] = serving.get(revision, 0) + capacity.workers
    for name, alias in sorted(dict(registry.aliases).items()):
        revisions = {alias.model_revision}
        rollout = registry.open_rollouts.get(name)
        if rollout is not None:
            revisions.add(rollout.candidate_revision)
        for revision in sorted(revisions):
            yield ("ledgerlm_alias_serving_workers", "Live workers taking work for a revision an alias "
                   "routes to", {"alias": name, "revision": revision}, serving.get(revision, 0))

