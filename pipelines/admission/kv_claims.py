"""KV claims: what admitted interactive work may hold of its engines' KV cache, and when a
pool's claims are too many to start one more request now.

The KV cache, not the count of sequences, caps what an engine holds: a request holds about
its prompt plus what it generates. Admission gives each admitted request a claim of its
prompt tokens plus its max output tokens, capped at the revision's max length (`claim_of`),
held on the worker it is placed on (the owner of its work partition, as the fleet's
heartbeats say; the worker that started it, once its `GenerationStarted` is read) until it
settles, however it ends: a terminal, an expiry, or a lost worker's settlement (`release`
is by request id, so a second end releases nothing).

Replay: a claim is a function of fields on the log (`GenerationRequested.input_tokens` and
`max_output_tokens`, the revision's max length, the start's worker), never of the clock.
A rebuilt admission claims again for every open reservation of its ledger partitions
(`BudgetReserved.tokens` is prompt plus max output), on the worker that started it where
the outcomes say (`pipelines.admission.lost_workers.note_running`); work still queued counts for its
pool and on no worker until it starts (its partition is a placement, not a decision).

Admission's decision (`kv_check`, pure), for one (pool, revision) whose workers report a
KV capacity: claims within the capacity admitted against (the engines' KV tokens, lowered
while they preempt, `PreemptionGuard`, times `Settings.kv_overcommit`) start at once; past
it a request waits for enough claims to drain, at the measured service pace. It is admitted
if it can start within its deadline and the claims beyond the capacity stay within the
queue's bound (`QueueBound.per_slot` capacities of them, high priority `high_factor` times
as many, so normal work is shed first); otherwise refused as `kv_capacity`, with when to
come back. A pool whose workers report no KV capacity is judged by its slots alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Iterable

from models.events_generation import UsageSettled
from models.quota import Reject

Key = tuple[str, str]  # (pool, revision), as `pipelines.admission.capacity.Key`
MAX_RETRY_MS = 30_000


def claim_of(input_tokens: int, max_output_tokens: int, max_model_len: int | None) -> int:
    """The KV tokens a request may come to hold: its prompt and every output token it may
    make, never more than the revision's max length (None or 0: no cap)."""
    tokens = max(0, input_tokens) + max(0, max_output_tokens)
    return min(tokens, max_model_len) if max_model_len else tokens


@dataclass
class Claim:
    key: Key
    tokens: int
    high: bool
    worker_id: str | None  # where it is placed, or runs; None: no worker known yet
    running: bool = False  # its start was read


class KvClaims:
    """The claims of open requests, by request id, summed per (pool, revision) and per worker.
    Read from other threads (a metrics scrape) through the accessors, which read copies."""

    def __init__(self) -> None:
        self._claims: dict[str, Claim] = {}
        self._by_key: dict[Key, list[int]] = {}  # key -> [held, running, high waiting]
        self._by_worker: dict[str, int] = {}

    def _count(self, c: Claim, sign: int) -> None:
        sums = self._by_key.setdefault(c.key, [0, 0, 0])
        sums[0] += sign * c.tokens
        sums[1] += sign * c.tokens * c.running
        sums[2] += sign * c.tokens * (c.high and not c.running)
        if c.worker_id is not None:
            left = self._by_worker.get(c.worker_id, 0) + sign * c.tokens
            if left:
                self._by_worker[c.worker_id] = left
            else:
                self._by_worker.pop(c.worker_id, None)

    def hold(self, request_id: str, key: Key, tokens: int, *, high: bool = False, worker_id: str | None = None,
             running: bool = False) -> None:
        """Claims `tokens` for an admitted request (once: a second hold changes nothing)."""
        if request_id in self._claims:
            return
        claim = Claim(key, max(0, tokens), high, worker_id, running)
        self._claims[request_id] = claim
        self._count(claim, 1)

    def started(self, request_id: str, worker_id: str) -> None:
        """The request runs on `worker_id`: its claim is held there from now on."""
        claim = self._claims.get(request_id)
        if claim is None or (claim.running and claim.worker_id == worker_id):
            return
        self._count(claim, -1)
        claim.worker_id, claim.running = worker_id, True
        self._count(claim, 1)

    def release(self, request_id: str) -> int:
        """Ends the request's claim; returns the tokens released (0 when none was held)."""
        claim = self._claims.pop(request_id, None)
        if claim is None:
            return 0
        self._count(claim, -1)
        return claim.tokens

    def release_settled(self, outputs) -> None:
        """Releases the claims of the requests settled in `outputs` ((topic, envelope) pairs)."""
        for _, env in outputs:
            if isinstance(env.payload, UsageSettled):
                self.release(env.payload.request_id)

    def prune(self, open_ids) -> None:
        """Forgets claims of requests no longer open (settled unseen, or never written)."""
        for request_id in [r for r in self._claims if r not in open_ids]:
            self.release(request_id)

    def forget(self) -> None:
        self._claims.clear()
        self._by_key.clear()
        self._by_worker.clear()

    def rebuild(self, reservations: Iterable, *, key: Callable[[object], Key],
                max_model_len: Callable[[str], int | None]) -> None:
        """Claims again for open reservations (`models.reservations.Reservation`): prompt plus
        max output (their tokens) under the revision's cap, on the worker running each."""
        self.forget()
        for r in reservations:
            self.hold(r.request_id, key(r), claim_of(r.tokens, 0, max_model_len(r.model_revision)),
                      worker_id=r.worker_id, running=r.worker_id is not None)

    # -- what admission and its metrics read ------------------------------------------

    def claims(self, key: Key) -> int:
        """KV tokens claimed by open work of (pool, revision), running or waiting."""
        return self._by_key.get(key, (0, 0, 0))[0]

    def sums(self, key: Key) -> tuple[int, int, int]:
        """(held, of which running, waiting high-priority claims) of (pool, revision)."""
        held, running, high = self._by_key.get(key, (0, 0, 0))
        return held, running, high

    def on_worker(self, worker_id: str) -> int:
        """KV tokens claimed by work placed on or running on `worker_id`."""
        return self._by_worker.get(worker_id, 0)

    def keys(self) -> list[Key]:
        return [k for k, sums in list(self._by_key.items()) if sums[0]]

    def of(self, request_id: str) -> Claim | None:
        return self._claims.get(request_id)


@dataclass(frozen=True)
class KvOutlook:
    """What admission knows of one (pool, revision)'s KV when it decides a request."""

    capacity: int = 0  # claims admitted against (after preemptions and overcommit); 0: not reported
    held: int = 0  # claims of open work, running or waiting
    running: int = 0
    high_waiting: int = 0


@dataclass(frozen=True)
class KvWait:
    excess: int  # claims past the capacity with this request's, of the work served before it
    wait_ms: int  # until enough of them drain for it to start


def kv_wait(kv: KvOutlook, claim: int, *, priority: str, per_request_ms: float) -> KvWait:
    """When a request of `claim` tokens could start: once the claims ahead of it (running
    and waiting; only running and high for high priority, which is served first) less the
    capacity have drained. The pool turns its capacity over about once a request's service,
    so they drain at `capacity` per `per_request_ms`; with nothing ahead it starts at once,
    alone if it must."""
    ahead = kv.running + kv.high_waiting if priority == "high" else kv.held
    excess = max(0, ahead + claim - kv.capacity)
    drain = min(excess, ahead)
    return KvWait(excess, int(drain * per_request_ms / kv.capacity) if kv.capacity > 0 and drain else 0)


def kv_limit(capacity: int, *, priority: str, queue_factor: float, high_factor: float) -> int:
    """The claims a pool may hold, running and waiting: its capacity, and `queue_factor`
    capacities more waiting (`high_factor` times as many for high priority)."""
    waiting = queue_factor * (high_factor if priority == "high" else 1.0)
    return int(capacity * (1.0 + waiting))


def kv_check(kv: KvOutlook, claim: int, *, key: Key, priority: str, per_request_ms: float, serve_ms: int,
             deadline_left_ms: int | None, queue_factor: float, high_factor: float) -> Reject | None:
    """Why the pool's KV cannot take a request of `claim` tokens now, or None (see the module)."""
    if kv.capacity <= 0 or claim <= 0:
        return None
    pool, revision = key
    limit = kv_limit(kv.capacity, priority=priority, queue_factor=queue_factor, high_factor=high_factor)
    total = kv.held + claim
    if total > limit:
        drain_ms = (total - limit) * per_request_ms / kv.capacity
        return Reject("kv_capacity", f"KV claims on pool {pool}, revision {revision} would reach {total} tokens "
                                     f"({kv.held} held); its live workers admit {kv.capacity} at once and "
                                     f"{priority} priority queues up to {limit}: try again later",
                      min(MAX_RETRY_MS, max(1000, int(drain_ms))))
    wait = kv_wait(kv, claim, priority=priority, per_request_ms=per_request_ms)
    if deadline_left_ms is not None and wait.wait_ms and wait.wait_ms + serve_ms > deadline_left_ms:
        return Reject("kv_capacity", f"the deadline leaves {max(deadline_left_ms, 0)} ms; {kv.held} KV tokens are "
                                     f"claimed on pool {pool}, revision {revision}, whose live workers admit "
                                     f"{kv.capacity} at once, so {claim} more would start in about "
                                     f"{wait.wait_ms} ms and take {serve_ms} ms more",
                      min(MAX_RETRY_MS, max(1000, wait.wait_ms)))
    return None


class PreemptionGuard:
    """Lowers a revision's KV capacity while its engines preempt: each time a worker of it
    reports more preemptions than before (its running total rose between two looks), the
    capacity admission admits against is cut by `cut` (down to `floor`); after `quiet_s`
    without a rise it climbs back, evenly over another `quiet_s`. A worker's total that falls
    (it restarted) is a new start, not a rise. Fleet state, like the capacity it scales:
    judged by the clock, not replayed."""

    def __init__(self, clock: Callable[[], datetime], *, cut: float = 0.8, floor: float = 0.5,
                 quiet_s: float = 30.0):
        self._clock, self.cut, self.floor, self.quiet_s = clock, cut, floor, quiet_s
        self._totals: dict[Key, dict[str, int]] = {}  # key -> worker -> preemptions last seen
        self._low: dict[Key, tuple[float, datetime]] = {}  # key -> (factor at the last rise, when)

    def observe(self, key: Key, workers) -> float:
        """Looks at the workers of `key` (`models.fleet.WorkerState`); returns the factor now."""
        now = self._clock()
        seen = self._totals.get(key, {})
        totals = {w.worker_id: w.preemptions for w in workers}
        self._totals[key] = totals
        if any(total > seen[w] for w, total in totals.items() if w in seen):
            self._low[key] = (max(self.floor, self.factor(key, now) * self.cut), now)
        return self.factor(key, now)

    def factor(self, key: Key, now: datetime | None = None) -> float:
        if key not in self._low:
            return 1.0
        low, at = self._low[key]
        quiet = ((now or self._clock()) - at).total_seconds() - self.quiet_s
        if quiet <= 0:
            return low
        if quiet >= self.quiet_s:
            self._low.pop(key, None)  # quiet long enough: back to the whole capacity
            return 1.0
        return low + (1.0 - low) * quiet / self.quiet_s
