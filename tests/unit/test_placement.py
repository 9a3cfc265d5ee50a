"""Placement of queued work on partitions (`pipelines.admission.placement`): a prefix's requests stay
on one partition while they are few, a burst of them spreads over every worker within the
slack, whichever way the partitions are assigned, and what ends is counted out."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from pipelines.eventlog import partition_for
from pipelines.admission.placement import Placement, owners_by_topic, probe_order
from models.fleet import WorkerState

P = 32


def assignment(workers: int, how: str) -> dict[int, str]:
    """Partitions to workers the way the consumer groups split them: round robin (the
    embedded log) or in contiguous ranges (Kafka's range assignor)."""
    if how == "round-robin":
        return {p: f"w{p % workers}" for p in range(P)}
    return {p: f"w{p * workers // P}" for p in range(P)}


def test_the_probe_order_visits_every_partition_once_and_differs_by_affinity():
    orders = {tuple(probe_order(f"prefix-{i}", P)) for i in range(50)}
    assert all(sorted(o) == list(range(P)) for o in orders)
    assert len({o[0] for o in orders}) > 15, "50 prefixes should start on many partitions"
    assert probe_order("same", P) == probe_order("same", P)


def test_light_traffic_of_a_prefix_stays_on_its_first_partition():
    placement = Placement(slack=2)
    owners = assignment(4, "round-robin")
    home = probe_order("tenant-a/system-1", P)[0]
    for i in range(50):  # one at a time: each ends before the next comes
        assert placement.choose("work", P, f"r{i}", "tenant-a/system-1", owners) == home
        placement.ended(f"r{i}")
    assert placement.loads("work") == [0] * P


def test_without_an_affinity_the_request_ids_hash_places_it():
    placement = Placement()
    assert placement.choose("work", P, "gen_abc", None) == partition_for("gen_abc", P)
    assert placement.choose("work", P, "gen_abc", "x") == partition_for("gen_abc", P), "placed once, kept"


@pytest.mark.parametrize("workers", [2, 3, 4])
@pytest.mark.parametrize("how", ["round-robin", "range"])
@pytest.mark.parametrize("prefixes", [1, 3])
@pytest.mark.parametrize("slots", [None, 2])
def test_a_burst_spreads_over_every_worker_within_the_slack(workers, how, prefixes, slots):
    """All in flight at once (nothing ends during the burst), with the workers' slots known
    or not: once every worker is full, none holds more than the slack above another."""
    rng = random.Random(workers * 10 + prefixes)
    owners = assignment(workers, how)
    room = None if slots is None else {f"w{w}": slots for w in range(workers)}
    for burst in (12, 64, 256):
        placement = Placement(slack=2)
        share = Counter()
        for i in range(burst):
            p = placement.choose("work", P, f"r{i}", f"prefix-{rng.randrange(prefixes)}", owners, room)
            share[owners[p]] += 1
            loads = [share[f"w{w}"] for w in range(workers)]
            assert max(loads) - min(loads) <= max(2, slots or 0), (burst, i, loads)
        if burst >= 64:
            assert max(loads) / min(loads) <= 1.5, (burst, loads)


def test_a_prefix_stays_on_its_worker_while_it_has_room_and_moves_when_it_is_full():
    """Four workers of four slots, twelve prefixes, eight requests in flight: most of each
    prefix's requests go to one worker (its prefix cache's), and a request waits behind a
    full worker only when every worker is full."""
    rng = random.Random(7)
    owners = assignment(4, "range")
    slots = {f"w{w}": 4 for w in range(4)}
    placement = Placement(slack=2)
    open_ids: dict[str, str] = {}
    by_prefix: dict[int, Counter] = {k: Counter() for k in range(12)}
    for i in range(3000):
        if len(open_ids) >= 8:
            done = rng.choice(sorted(open_ids))
            placement.ended(done)
            del open_ids[done]
        k = rng.randrange(12)
        worker = owners[placement.choose("work", P, f"r{i}", f"prefix-{k}", owners, slots)]
        open_ids[f"r{i}"] = worker
        by_prefix[k][worker] += 1
        busy = Counter(open_ids.values())
        assert busy[worker] <= 4 or all(busy[w] >= 4 for w in slots), busy
    on_home = sum(c.most_common(1)[0][1] for c in by_prefix.values()) / 3000
    assert on_home >= 0.7, on_home


def test_ended_and_pruned_work_leaves_the_load():
    placement = Placement(slack=1)
    for i in range(4):
        placement.choose("work", P, f"r{i}", "same")
    assert sum(placement.loads("work")) == 4
    placement.ended("r0")
    placement.ended("r0")  # twice is once
    placement.prune({"r1"})
    assert sum(placement.loads("work")) == 1
    placement.forget()
    assert placement.loads("work") == []


def test_owners_come_from_the_workers_heartbeats():
    from datetime import datetime, timezone
    from models.events_fleet import Capacity
    now = datetime.now(timezone.utc)

    def worker(worker_id, partitions):
        return WorkerState(worker_id=worker_id, pool="interactive", model_revision="m@1", engine_config_hash="e",
                           host="h", pid=1, capacity=Capacity(max_seqs=2, kv_cache_tokens=0, max_model_len=64),
                           heartbeat_interval_ms=1000, joined_at=now, last_seen=now, work_partitions=partitions)
    owners, slots = owners_by_topic([worker("a", {"t.normal": [0, 2], "t.high": [1]}),
                                     worker("b", {"t.normal": [1]}), worker("c", None)])
    assert owners == {"t.normal": {0: "a", 2: "a", 1: "b"}, "t.high": {1: "a"}}
    assert slots == {"a": 2, "b": 2}


def test_a_requests_affinity_is_its_tenant_and_shared_prefix_and_carries_no_text():
    from models.digests import TenantDigests
    from pipelines.generation.submission import AFFINITY_PREFIX_CHARS, SubmitGeneration, prefix_affinity
    digests = TenantDigests("secret")

    def chat(*messages):
        return SubmitGeneration(request_id=None, model_alias="m", prompt=None, max_output_tokens=4, deadline_ms=None,
                                messages=tuple({"role": r, "content": c} for r, c in messages))

    system = ("system", "You answer questions about invoices.")
    a = prefix_affinity(chat(system, ("user", "What is due?")), "t1", digests)
    assert a == prefix_affinity(chat(system, ("user", "Who paid?")), "t1", digests), "same system prompt"
    assert a != prefix_affinity(chat(system, ("user", "What is due?")), "t2", digests), "another tenant"
    assert a != prefix_affinity(chat(("system", "Other."), ("user", "What is due?")), "t1", digests)
    assert "invoices" not in a and len(a) == 32
    assert prefix_affinity(chat(("user", "hi")), "t1", digests) is None, "a lone turn shares nothing"

    def text(prompt):
        return SubmitGeneration(request_id=None, model_alias="m", prompt=prompt, max_output_tokens=4, deadline_ms=None)
    head = "x" * AFFINITY_PREFIX_CHARS
    assert prefix_affinity(text(head + "one"), "t1", digests) == prefix_affinity(text(head + "two"), "t1", digests)
    assert prefix_affinity(text("short prompt"), "t1", digests) is None
