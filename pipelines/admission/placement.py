"""Which partition of its work topic an admitted generation waits on: prefix-cache affinity
without piling a burst onto one worker.

A request that names an `affinity` (a keyed digest of its tenant and the leading part of
its prompt: the system prompt of a chat, `pipelines.generation.submission.prefix_affinity`) has an
order over the topic's partitions, fixed by that digest (rendezvous hashing). It goes to
the first partition in that order whose worker has a slot free, counting what this
admission placed on that worker's partitions and has not yet seen end. So while there is
room, a prefix's requests wait on its first partition, which one worker owns, and that
worker's engine finds the prompt's prefix in its KV cache (vLLM's prefix caching); when
its worker is full they go to the next worker in the order that has room. Under a burst
that fills every worker, each goes to the first partition whose worker is within `slack`
of the least loaded one, so no worker queues more than `slack` above another and the
burst splits evenly. Which worker owns which partition, and its slots, come from the
fleet's heartbeats (`WorkerHeartbeat.work_partitions`); where no heartbeat says, each
partition counts as a worker of its own with no slot known free, and a burst spreads
evenly over partitions (each worker's share then follows its share of the partitions).

Free KV counts as free slots do, where the workers report their KV cache (its tokens times
`Settings.kv_overcommit`): a worker has room for a request when it has a slot free and the
KV claims on it (`pipelines.admission.kv_claims`) plus the request's fit, or it holds none (a request
bigger than a worker's cache runs there alone). Once no worker has room and every one
reports its KV, a burst fills them in proportion to their KV instead of their count: each
goes to the first partition whose worker, with the request, is within `slack` requests of
its size of the least filled one, so a worker with twice the KV takes twice the tokens.

A request without an affinity goes where its key puts it (the request id's hash) while
that partition's worker has room; when it has none, to the next partition (in partition
order) whose worker has, or under a burst as a prefix's would. It counts toward the load
all the same. The load is this admission's own view: each
admission balances what it decides, so together they are about balanced too. It is
forgotten when admission's partitions move (nothing is lost: the choice is a placement,
pinned on `GenerationQueued.work_partition`, never a decision replay has to make again).
"""
from __future__ import annotations

import hashlib
import time
from functools import lru_cache
from typing import Callable

from models.events import Envelope
from models.topics import Topic

from pipelines.eventlog import partition_for
from pipelines.admission.kv_claims import KvClaims

DEFAULT_SLACK = 2  # how far above the least loaded partition a prefix's partition may fill


@lru_cache(maxsize=4096)  # on admission's path: a prefix's order is worked out once
def probe_order(affinity: str, partitions: int) -> tuple[int, ...]:
    """The partitions in the order `affinity` tries them: highest random weight first
    (rendezvous hashing), so consecutive choices land on unrelated partitions, and so on
    unrelated workers, whichever way the consumer group assigned them."""
    seed = affinity.encode()
    return tuple(sorted(range(partitions), key=lambda p: hashlib.blake2b(b"%d" % p, key=seed[:64],
                                                                          digest_size=8).digest(), reverse=True))


def owners_by_topic(workers) -> tuple[dict[str, dict[int, str]], dict[str, int]]:
    """Which worker owns each partition of each work topic, and each worker's slots, from
    the workers' last heartbeats (`models.fleet.WorkerState`)."""
    owners: dict[str, dict[int, str]] = {}
    slots: dict[str, int] = {}
    # Oldest first: a partition two heartbeats claim (one said before a rebalance moved it)
    # is the one that beat last's.
    for w in sorted(workers, key=lambda w: w.last_seen):
        for name, partitions in (w.work_partitions or {}).items():
            owners.setdefault(name, {}).update(dict.fromkeys(partitions, w.worker_id))
            slots[w.worker_id] = w.capacity.max_seqs
    return owners, slots


def kv_by_worker(workers, overcommit: float = 1.0) -> dict[str, int]:
    """The KV tokens of claims each worker admits (its engine's KV cache times `overcommit`),
    of those whose heartbeats report one."""
    return {w.worker_id: int(w.capacity.kv_cache_tokens * overcommit) for w in workers
            if w.capacity.kv_cache_tokens > 0}


class Placement:
    def __init__(self, *, slack: int = DEFAULT_SLACK):
        if slack < 1:
            raise ValueError("slack must be at least 1")
        self.slack = slack
        self._load: dict[str, list[int]] = {}  # topic -> open work per partition
        self._where: dict[str, tuple[str, int]] = {}  # request id -> (topic, partition)

    def choose(self, topic: str, partitions: int, request_id: str, affinity: str | None,
               owners: dict[int, str] | None = None, slots: dict[str, int] | None = None, *,
               claim: int = 0, kv: dict[str, int] | None = None, kv_load: dict[str, int] | None = None) -> int:
        """The partition for `request_id`, counted as open there until `ended`. `owners`: the
        worker that owns each partition now, and `slots`: how many sequences each runs at
        once (the fleet's heartbeats say both). A prefix goes to the first worker in its
        order with a slot free; when every worker is full, to the first within `slack` of
        the least loaded. A partition nobody is known to own counts as a worker of its own,
        with no slot known free. `claim`: the request's KV tokens; `kv`: the claims each
        worker admits, and `kv_load`: those it holds (see the module)."""
        if request_id in self._where:
            return self._where[request_id][1]
        load = self._load.setdefault(topic, [0] * partitions)
        if len(load) < partitions:  # a topic that grew
            load.extend([0] * (partitions - len(load)))
        if affinity is None:
            chosen = partition_for(request_id, partitions)
            if owners and chosen in owners:  # its key's partition, unless another worker has room and its has none
                order = tuple((chosen + i) % partitions for i in range(partitions))
                chosen = self._with_room(load, order, owners, slots or {}, claim, kv or {}, kv_load or {})
        else:
            chosen = self._with_room(load, probe_order(affinity, partitions), owners or {}, slots or {}, claim,
                                     kv or {}, kv_load or {})
        load[chosen] += 1
        self._where[request_id] = (topic, chosen)
        return chosen

    def _with_room(self, load: list[int], order: tuple[int, ...], owners: dict[int, str], slots: dict[str, int],
                   claim: int, kv: dict[str, int], kv_load: dict[str, int]) -> int:
        unit = [owners.get(p, p) for p in range(len(load))]
        by_unit: dict = {}
        for p, open_here in enumerate(load):
            by_unit[unit[p]] = by_unit.get(unit[p], 0) + open_here

        def room(u) -> bool:
            held, admits = kv_load.get(u, 0), kv.get(u, 0)
            return by_unit[u] < slots.get(u, 0) and (admits <= 0 or held == 0 or held + claim <= admits)
        chosen = next((p for p in order if room(unit[p])), None)
        if chosen is not None:
            return chosen
        if claim > 0 and all(kv.get(u, 0) > 0 for u in by_unit):
            fill = {u: (kv_load.get(u, 0) + claim) / kv[u] for u in by_unit}
            lowest = min(fill.values())
            return next(p for p in order if fill[unit[p]] <= lowest + self.slack * claim / kv[unit[p]])
        bound = min(by_unit.values()) + self.slack
        return next(p for p in order if by_unit[unit[p]] < bound)

    def ended(self, request_id: str) -> None:
        where = self._where.pop(request_id, None)
        if where is not None:
            self._load[where[0]][where[1]] -= 1

    def prune(self, open_ids) -> None:
        """Forgets work no longer open (expired, ended as lost, never written)."""
        for request_id in [r for r in self._where if r not in open_ids]:
            self.ended(request_id)

    def forget(self) -> None:
        self._load.clear()
        self._where.clear()

    def loads(self, topic: str) -> list[int]:
        return list(self._load.get(topic, ()))


class FleetPlacement(Placement):
    """Admission's placement: the owners, slots and KV of work partitions' workers from the
    fleet's live workers (`live`, None where admission has no fleet view), looked at no more
    than every `OWNERS_EVERY_S`; the KV claims on each from `claims`."""

    OWNERS_EVERY_S = 0.25  # how stale the owners of work partitions may be

    def __init__(self, live: Callable[[], list] | None, *, slack: int = DEFAULT_SLACK,
                 claims: KvClaims | None = None, kv_overcommit: float = 1.0):
        super().__init__(slack=slack)
        self._live = live
        self._claims = claims if claims is not None else KvClaims()
        self._overcommit = kv_overcommit
        self._owners: dict[str, dict[int, str]] = {}
        self._slots: dict[str, int] = {}
        self._kv: dict[str, int] = {}
        self._owners_at = float("-inf")

    def place(self, topic: Topic, queued: Envelope, claim: int = 0) -> Envelope:
        """Queued work on the partition chosen for it (a revision's request-keyed work
        topics; the tenant-keyed ones keep their key's); `claim`: its KV tokens."""
        if topic.keyed_by != "request":
            return queued
        req = queued.payload.request
        owners = self._owners_of(topic.name)
        kv_load = {w: self._claims.on_worker(w) for w in self._kv}
        partition = self.choose(topic.name, topic.partitions, req.request_id, req.affinity, owners, self._slots,
                                claim=claim, kv=self._kv, kv_load=kv_load)
        return queued.model_copy(update={"payload": queued.payload.model_copy(update={"work_partition": partition})})

    def owner_of(self, topic_name: str, partition: int | None) -> str | None:
        """The worker owning a partition of a work topic, as the heartbeats say (None: unknown)."""
        return None if partition is None else (self._owners_of(topic_name) or {}).get(partition)

    def _owners_of(self, topic_name: str) -> dict[int, str] | None:
        if self._live is None:
            return None
        if time.monotonic() - self._owners_at >= self.OWNERS_EVERY_S:
            self._owners_at = time.monotonic()
            live = self._live()
            self._owners, self._slots = owners_by_topic(live)
            self._kv = kv_by_worker(live, self._overcommit)
        return self._owners.get(topic_name)

