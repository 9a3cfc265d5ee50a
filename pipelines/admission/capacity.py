"""Capacity-aware admission: work the live fleet cannot serve in time is refused before it
queues, the queue per (pool, revision) is bounded, and normal priority is shed before high.

What admission knows of one (pool, revision) when it decides a request (an `Outlook`):

- the live capacity, from the fleet's heartbeats (`FleetView.capacity()`): workers taking
  work, slots (the sum of their max sequences), running, waiting, output tokens/s;
- the queue ahead: work this processor queued and has not seen start or end in its own
  partitions. That is an approximation per admission instance: another instance's work is
  seen only through the fleet's reported `waiting` (what workers took and have not started),
  and after a rebalance the count starts again from zero. The two overlap (work a worker
  took is in both), so the larger of them is taken, never their sum;
- service rates measured from what admission reads (`ServiceRates`), smoothed: queue time
  from starts, time to first token and time per output token from completed generations'
  timings, and the whole service time. Until measured, the floors (`Floors`, set by
  `Settings.admission_floor_*`; both in `pipelines.admission.service_rates`). A restarted (or rebalanced) processor folds the latest
  starts and ends of its partitions again (`pipelines.admission.service_readback`), so it decides
  with the rates its predecessor measured.

The decisions (`check`, pure): no live worker → `no_capacity`; the queue ahead over its
bound (`QueueBound`, proportional to the live slots) → `shed`, normal priority first, high
up to twice as far; an estimated completion after the deadline → `deadline`; the pool's KV
claims past what its KV cache admits, beyond the queue's bound or the deadline →
`kv_capacity` (`pipelines.admission.kv_claims`). High priority is served first (workers take it
first), so only high work queued ahead delays it.
A fleet not read yet (or not watched) refuses nothing: unknown is not none.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable, Protocol

from models import topics
from models.events import Envelope
from models.events_generation import (
    GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationRequested, GenerationStarted,
)
from models.fleet import PoolCapacity, WorkerState
from models.quota import Reject
from pipelines.admission.kv_claims import KvClaims, KvOutlook, PreemptionGuard, claim_of, kv_check
from pipelines.admission.service_rates import Floors, ServiceEstimate, ServiceRates

Key = tuple[str, str]  # (pool, revision)
NO_CAPACITY_RETRY_MS = 2000  # a worker joining (or restarting) is seen within about this long
# No live worker is taken for none only once none has served for this long (nor since admission
# started watching): a worker joining, or restarting, as the request comes is not refused for.
# The API refuses a revision without workers at the door; this is the backstop behind it.
NO_CAPACITY_HOLD_S = 10.0
MAX_SHED_RETRY_MS = 30_000


def key_of(pool: str | None, revision: str) -> Key:
    return (pool or topics.SHARED_POOL, revision)


@dataclass(frozen=True)
class QueueBound:
    """How much work may wait for one (pool, revision): `per_slot` per live slot, never
    less than `floor`; high priority up to `high_factor` times as much, so when capacity
    falls normal work is shed first (`Settings.admission_queued_per_slot`, `..._floor`).
    In KV tokens likewise: claims up to `kv_overcommit` times the live workers' KV cache
    start at once, and `per_slot` times that many more may wait (`pipelines.admission.kv_claims`,
    `Settings.kv_overcommit`)."""

    per_slot: float = 4.0
    floor: int = 512
    high_factor: float = 2.0
    kv_overcommit: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.kv_overcommit) and self.kv_overcommit > 0):
            raise ValueError(f"kv_overcommit must be a number above 0, not {self.kv_overcommit!r}")

    @classmethod
    def from_settings(cls, settings) -> "QueueBound":
        return cls(per_slot=settings.admission_queued_per_slot, floor=settings.admission_queued_floor,
                   kv_overcommit=settings.kv_overcommit)

    def limit(self, priority: str, slots: int) -> int:
        normal = max(self.floor, math.ceil(self.per_slot * slots))
        return math.ceil(normal * self.high_factor) if priority == "high" else normal


@dataclass(frozen=True)
class Outlook:
    """What admission knows of one (pool, revision) when it decides a request."""

    key: Key
    capacity: PoolCapacity | None  # None: the fleet is not watched, or not read yet
    queued: int = 0  # queued by this processor, not seen started or ended (every priority)
    queued_high: int = 0
    rates: ServiceRates = field(default_factory=ServiceRates)
    kv: KvOutlook = field(default_factory=KvOutlook)


@dataclass(frozen=True)
class Estimate:
    ahead: int  # requests served before this one
    wait_ms: int  # until it starts
    serve_ms: int  # from its start to its last token

    @property
    def total_ms(self) -> int:
        return self.wait_ms + self.serve_ms


def ahead_of(outlook: Outlook, priority: str) -> int:
    if priority == "high":  # served before any normal work
        return outlook.queued_high
    waiting = outlook.capacity.waiting if outlook.capacity is not None else 0
    return max(outlook.queued, waiting)


def estimate(outlook: Outlook, *, priority: str, max_output_tokens: int, floors: Floors = Floors()) -> Estimate:
    """When a request would end: the queue ahead drained by the live slots, its first
    token, then each further one at the measured pace."""
    rates, cap = outlook.rates, outlook.capacity
    # Before a generation of the revision has ended, the floors: the heartbeats' tokens/s is
    # no pace per sequence (a worker that has just started its first requests reports a few
    # tokens over a whole beat), and a pace read too slow refuses work the fleet would serve.
    tpot = floors.ms_per_output_token if rates.tpot_ms is None else rates.tpot_ms
    ttft = floors.first_token_ms if rates.ttft_ms is None else rates.ttft_ms
    serve = ttft + tpot * max(0, max_output_tokens - 1)
    if cap is None or cap.max_seqs <= 0:  # no live view: the queue time lately seen
        return Estimate(0, int(rates.queue_ms or 0), int(serve))
    ahead = ahead_of(outlook, priority)
    idle = max(0, cap.max_seqs - cap.running)
    per_request = serve if rates.service_ms is None else rates.service_ms
    wait = max(0, ahead - idle) * per_request / cap.max_seqs
    return Estimate(ahead, int(wait), int(serve))


def check(outlook: Outlook, *, priority: str, max_output_tokens: int, deadline_left_ms: int | None,
          bound: QueueBound = QueueBound(), floors: Floors = Floors(), claim: int = 0) -> Reject | None:
    """Why the live fleet cannot take this request now, or None. `claim`: its KV tokens."""
    cap, (pool, revision) = outlook.capacity, outlook.key
    if cap is None:
        return None
    if cap.workers == 0 or cap.max_seqs <= 0:
        return Reject("no_capacity", f"no live worker of pool {pool} serves revision {revision}; try again shortly",
                      NO_CAPACITY_RETRY_MS)
    queued = max(outlook.queued, cap.waiting)
    limit = bound.limit(priority, cap.max_seqs)
    est = estimate(outlook, priority=priority, max_output_tokens=max_output_tokens, floors=floors)
    if queued >= limit:
        # Come back once the excess has drained, at the measured pace.
        per_request = est.serve_ms if outlook.rates.service_ms is None else outlook.rates.service_ms
        drain_ms = (queued - limit + 1) * per_request / cap.max_seqs
        return Reject("shed", f"{queued} requests wait for pool {pool}, revision {revision} "
                              f"({cap.workers} live workers, {cap.max_seqs} slots); {priority} priority "
                              f"queues up to {limit}: try again later",
                      min(MAX_SHED_RETRY_MS, max(1000, int(drain_ms))))
    if deadline_left_ms is not None and est.total_ms > deadline_left_ms:
        # Worth a retry only when the request alone fits: then the queue is what is in the way.
        retry = est.wait_ms if est.serve_ms <= deadline_left_ms and est.wait_ms > 0 else None
        return Reject("deadline", f"the deadline leaves {max(deadline_left_ms, 0)} ms; with {est.ahead} requests "
                                  f"queued ahead on {cap.workers} live workers ({cap.max_seqs} slots) it would "
                                  f"start in about {est.wait_ms} ms and take {est.serve_ms} ms more", retry)
    per_request = est.serve_ms if outlook.rates.service_ms is None else outlook.rates.service_ms
    return kv_check(outlook.kv, claim, key=outlook.key, priority=priority, per_request_ms=per_request,
                    serve_ms=est.serve_ms, deadline_left_ms=deadline_left_ms, queue_factor=bound.per_slot,
                    high_factor=bound.high_factor)


class CapacitySource(Protocol):
    """The fleet as admission watches it (`pipelines.fleet.FleetView`)."""

    complete_at: datetime | None

    def capacity(self) -> dict[Key, PoolCapacity]: ...

    def all(self) -> list[WorkerState]: ...

    def refresh(self) -> object: ...


def wall_clock() -> datetime:
    return datetime.now(timezone.utc)


class CapacityBook:
    """Admission's side: what it queued and has not seen start or end, the service rates it
    measured (and the quota's `estimate`), the KV claims of its open work (`claims`), and the
    fleet's live capacity (`source`; None: nothing is refused for capacity)."""

    def __init__(self, source: CapacitySource | None, *, bound: QueueBound | None = None,
                 floors: Floors | None = None, hold_s: float = NO_CAPACITY_HOLD_S,
                 clock: Callable[[], datetime] = wall_clock, claims: KvClaims | None = None):
        self.source = source
        self.kv_claims = claims if claims is not None else KvClaims()
        self.pressure = PreemptionGuard(clock)
        self._hold = timedelta(seconds=hold_s)
        self._clock = clock
        self._since = clock()
        self.bound = bound or QueueBound()
        self.floors = floors or Floors()
        self.estimate = ServiceEstimate.from_floors(self.floors)
        self.rates: dict[Key, ServiceRates] = {}
        self._queued: dict[str, tuple[Key, bool]] = {}  # request id -> (key, high)
        self._counts: dict[Key, list[int]] = {}  # key -> [queued, of which high]
        self._queued_since: dict[str, datetime] = {}  # request id -> when queued, for the oldest age

    def rates_of(self, key: Key) -> ServiceRates:
        return self.rates.setdefault(key, ServiceRates())

    def queued(self, request_id: str, key: Key, priority: str) -> None:
        if request_id in self._queued:
            return
        high = priority == "high"
        self._queued[request_id] = (key, high)
        self._queued_since[request_id] = self._clock()
        counts = self._counts.setdefault(key, [0, 0])
        counts[0] += 1
        counts[1] += high

    def _unqueue(self, request_id: str) -> Key | None:
        entry = self._queued.pop(request_id, None)
        self._queued_since.pop(request_id, None)
        if entry is None:
            return None
        key, high = entry
        counts = self._counts[key]
        counts[0] -= 1
        counts[1] -= high
        return key

    def started(self, request_id: str, key: Key, queued_ms: int) -> None:
        key = self._unqueue(request_id) or key
        self.rates_of(key).observe_start(queued_ms)
        self.estimate.observe_queue(queued_ms)

    def ended(self, request_id: str, key: Key, payload) -> None:
        key = self._unqueue(request_id) or key
        if isinstance(payload, GenerationCompleted):
            self.rates_of(key).observe_completed(payload)

    def observe(self, env: Envelope, key: Key) -> None:
        """Follows one outcome of `key` (a start or an end; anything else is no measure)."""
        p = env.payload
        if isinstance(p, GenerationStarted):
            self.started(p.request_id, key, p.queued_ms)
        elif isinstance(p, (GenerationCompleted, GenerationFailed, GenerationCancelled)):
            self.ended(p.request_id, key, p)

    def forget_rates(self) -> None:
        """Before the rates are read back: only what the log holds is measured."""
        self.rates.clear()
        self.estimate.queue_ms = 0.0

    def prune(self, open_ids) -> None:
        """Forgets queued work no longer open (expired, ended as lost, or never written)."""
        for request_id in [r for r in self._queued if r not in open_ids]:
            self._unqueue(request_id)

    def forget_queue(self) -> None:
        """After a rebalance: what this processor queued before is not known any more."""
        self._queued.clear()
        self._counts.clear()
        self._queued_since.clear()

    def queue_signals(self, now: datetime) -> dict[Key, tuple[int, float]]:
        """Per (pool, revision) this processor queued for: the work not seen started or ended,
        and the age in seconds of the oldest of it (0 when none). Read from another thread (a
        scrape), so it works on copies."""
        queued, since = self._queued.copy(), self._queued_since.copy()
        signals = {key: (0, 0.0) for key in self._counts.copy()}
        for request_id, (key, _) in queued.items():
            depth, oldest = signals.get(key, (0, 0.0))
            at = since.get(request_id)
            age = max(0.0, (now - at).total_seconds()) if at is not None else 0.0
            signals[key] = (depth + 1, max(oldest, age))
        return signals

    def outlook(self, key: Key, *, asked_at: datetime) -> Outlook:
        capacity = None
        if self.source is not None and self.source.complete_at is not None:
            capacity = self.source.capacity().get(key, PoolCapacity())
            if capacity.workers == 0 and self.source.complete_at < asked_at:
                # A worker that joined just before the request may not be read yet: read to now.
                self.source.refresh()
                capacity = self.source.capacity().get(key, PoolCapacity())
            if capacity.workers == 0 and self._served_lately(key):
                capacity = None  # not known to be none yet
        queued, high = self._counts.get(key, (0, 0))
        return Outlook(key, capacity, queued, high, self.rates_of(key), self._kv_outlook(key, capacity))

    def _kv_outlook(self, key: Key, capacity: PoolCapacity | None) -> KvOutlook:
        held, running, high = self.kv_claims.sums(key)
        return KvOutlook(self._kv_admitted(key, capacity), held, running, high)

    def _kv_admitted(self, key: Key, capacity: PoolCapacity | None) -> int:
        """The claims (pool, revision) admits at once: its live workers' KV tokens, lowered
        while they preempt, times the overcommit; 0 where they report none."""
        if capacity is None or capacity.kv_cache_tokens <= 0 or self.source is None:
            return 0
        workers = [w for w in self.source.all() if (w.pool, w.model_revision) == key]
        factor = self.pressure.observe(key, workers)
        return int(capacity.kv_cache_tokens * factor * self.bound.kv_overcommit)

    def claims(self, key: Key) -> int:
        """KV tokens claimed by the open work of (pool, revision) this processor admitted."""
        return self.kv_claims.claims(key)

    def kv_capacity(self, key: Key) -> int:
        """KV tokens of claims (pool, revision) admits at once now (its live workers' KV
        cache, lowered while they preempt, times `kv_overcommit`); 0 where none is reported
        or the fleet is not read. From any thread."""
        if self.source is None or self.source.complete_at is None:
            return 0
        capacity = self.source.capacity().get(key)
        if capacity is None or capacity.kv_cache_tokens <= 0:
            return 0
        return int(capacity.kv_cache_tokens * self.pressure.factor(key) * self.bound.kv_overcommit)

    def free_now(self, key: Key, *, asked_at: datetime) -> bool:
        """Whether a slot of (pool, revision) is free for one more request at once: live
        slots not running, less what this processor has queued there."""
        outlook = self.outlook(key, asked_at=asked_at)
        cap = outlook.capacity
        return cap is not None and cap.max_seqs - cap.running - outlook.queued > 0

    def _served_lately(self, key: Key) -> bool:
        signs = [w.left_at or w.last_seen for w in self.source.all() if (w.pool, w.model_revision) == key]
        return self._clock() - max(signs + [self._since]) < self._hold

    def check(self, req: GenerationRequested, *, pool: str | None, asked_at: datetime, now: datetime,
              max_model_len: int | None = None) -> Reject | None:
        """`asked_at`: when the request was made; `now`: when it is decided (its deadline counts
        from then); `max_model_len`: the revision's, which caps its KV claim."""
        outlook = self.outlook(key_of(pool, req.model_revision), asked_at=asked_at)
        left = None if req.deadline_at is None else int((req.deadline_at - now).total_seconds() * 1000)
        return check(outlook, priority=req.priority, max_output_tokens=req.max_output_tokens, deadline_left_ms=left,
                     bound=self.bound, floors=self.floors,
                     claim=claim_of(req.input_tokens, req.max_output_tokens, max_model_len))
