"""FleetState: who serves what, with what capacity, and who went silent, on a test clock."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from models.events_fleet import Capacity, WorkerDraining, WorkerHeartbeat, WorkerJoined, WorkerLeft
from models.fleet import FleetState

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
CAP = Capacity(max_seqs=8, kv_cache_tokens=4096, max_model_len=512)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def who(worker_id: str, *, pool: str = "interactive", revision: str = "rev-a", capacity: Capacity = CAP,
        interval_ms: int = 1000) -> dict:
    return dict(worker_id=worker_id, pool=pool, model_revision=revision, engine_config_hash=f"hash-{revision}",
                host="host-1", pid=100, capacity=capacity, heartbeat_interval_ms=interval_ms)


def joined(worker_id: str, **kw) -> WorkerJoined:
    return WorkerJoined(**who(worker_id, **kw))


def beat(worker_id: str, seq: int, *, free: int = 8, running: int = 0, waiting: int = 0, kv: float = 0.0,
         tps: float = 0.0, draining: bool = False, **kw) -> WorkerHeartbeat:
    return WorkerHeartbeat(**who(worker_id, **kw), seq=seq, draining=draining, running=running, waiting=waiting,
                           free_slots=free, kv_cache_usage=kv, output_tokens_per_s=tps)


def ids(workers) -> list[str]:
    return [w.worker_id for w in workers]


def test_a_joined_worker_is_live_with_its_revision_and_capacity():
    fleet = FleetState()
    fleet.apply(joined("w1", revision="rev-a"), at(0))
    [w] = fleet.live(at(0.5))
    assert (w.worker_id, w.pool, w.model_revision, w.engine_config_hash) == ("w1", "interactive", "rev-a", "hash-rev-a")
    assert w.capacity == CAP and w.joined_at == at(0)
    assert fleet.serves("interactive", "rev-a", at(0.5))
    assert not fleet.serves("interactive", "rev-b", at(0.5))
    assert not fleet.serves("other-pool", "rev-a", at(0.5))


def test_heartbeats_carry_load_and_keep_the_worker_live():
    fleet = FleetState()
    fleet.apply(joined("w1"), at(0))
    fleet.apply(beat("w1", 0, free=5, running=3, waiting=2, kv=0.4, tps=120.0), at(1))
    fleet.apply(beat("w1", 1, free=6, running=2, waiting=0, kv=0.25, tps=80.0), at(2))
    [w] = fleet.live(at(4.5))  # 2.5 s after the last beat: within three 1 s intervals
    assert (w.seq, w.free_slots, w.running, w.waiting, w.kv_cache_usage, w.output_tokens_per_s) == \
        (1, 6, 2, 0, 0.25, 80.0)
    assert w.last_seen == at(2)


def test_a_silent_worker_is_lost_after_three_of_its_intervals_with_its_last_heartbeat():
    fleet = FleetState()
    fleet.apply(joined("w1", interval_ms=500), at(0))
    fleet.apply(beat("w1", 0, interval_ms=500), at(0.5))
    assert ids(fleet.live(at(2.0))) == ["w1"]
    assert fleet.lost(at(2.0)) == []
    assert fleet.live(at(2.01)) == []  # 1.51 s of silence > 3 x 500 ms
    [lost] = fleet.lost(at(2.01))
    assert lost.worker_id == "w1" and lost.last_seen == at(0.5)
    assert not fleet.serves("interactive", "rev-a", at(2.01))


def test_lost_after_can_be_set_by_the_reader():
    fleet = FleetState()
    fleet.apply(joined("w1"), at(0))
    assert ids(fleet.live(at(9), lost_after_s=10)) == ["w1"]
    assert fleet.live(at(9)) == []
    assert ids(fleet.lost(at(1.5), lost_after_s=1)) == ["w1"]


def test_a_lost_worker_that_beats_again_is_live_again():
    fleet = FleetState()
    fleet.apply(joined("w1"), at(0))
    assert ids(fleet.lost(at(10))) == ["w1"]
    fleet.apply(beat("w1", 0), at(10))
    assert ids(fleet.live(at(10))) == ["w1"] and fleet.lost(at(10)) == []


def test_a_worker_that_left_is_neither_live_nor_lost_and_stray_beats_do_not_revive_it():
    fleet = FleetState()
    fleet.apply(joined("w1"), at(0))
    fleet.apply(WorkerLeft(worker_id="w1", reason="shutdown", exit_code=0), at(1))
    assert fleet.live(at(1)) == [] and fleet.lost(at(60)) == []
    w = fleet.worker("w1")
    assert (w.left_at, w.left_reason, w.exit_code) == (at(1), "shutdown", 0)
    fleet.apply(beat("w1", 7), at(1.1))
    assert fleet.live(at(1.1)) == []


def test_a_new_join_under_the_same_id_starts_a_new_life():
    fleet = FleetState()
    fleet.apply(joined("w1", revision="rev-a"), at(0))
    fleet.apply(beat("w1", 5, draining=True), at(1))
    fleet.apply(WorkerLeft(worker_id="w1", reason="crash", exit_code=1), at(2))
    fleet.apply(joined("w1", revision="rev-b"), at(3))
    fleet.apply(beat("w1", 0, revision="rev-b", free=7), at(4))  # seq restarts with the process
    [w] = fleet.live(at(4))
    assert (w.model_revision, w.seq, w.free_slots, w.draining, w.left_at) == ("rev-b", 0, 7, False, None)
    assert fleet.serves("interactive", "rev-b", at(4)) and not fleet.serves("interactive", "rev-a", at(4))


def test_an_old_or_repeated_heartbeat_changes_nothing():
    fleet = FleetState()
    fleet.apply(joined("w1"), at(0))
    fleet.apply(beat("w1", 3, free=2), at(3))
    fleet.apply(beat("w1", 2, free=8), at(3.5))
    fleet.apply(beat("w1", 3, free=8), at(3.6))
    w = fleet.worker("w1")
    assert (w.seq, w.free_slots, w.last_seen) == (3, 2, at(3))


def test_a_reader_that_starts_mid_topic_knows_a_worker_from_one_heartbeat():
    fleet = FleetState()
    fleet.apply(beat("w1", 41, revision="rev-b", free=3), at(100))
    [w] = fleet.live(at(100.5))
    assert (w.model_revision, w.engine_config_hash, w.capacity, w.free_slots, w.joined_at) == \
        ("rev-b", "hash-rev-b", CAP, 3, None)
    cap = fleet.capacity(at(100.5))
    assert set(cap) == {("interactive", "rev-b")} and cap["interactive", "rev-b"].max_seqs == 8


def test_a_draining_worker_is_live_but_takes_no_work_and_stays_draining():
    fleet = FleetState()
    fleet.apply(joined("w1"), at(0))
    fleet.apply(joined("w2"), at(0))
    fleet.apply(WorkerDraining(worker_id="w1", reason="engine_dead"), at(1))
    fleet.apply(beat("w1", 0, running=2, free=6), at(1.5))  # a beat without the flag does not undo it
    assert ids(fleet.live(at(2))) == ["w1", "w2"]
    assert [w.status(at(2)) for w in fleet.live(at(2))] == ["draining", "live"]
    assert ids(fleet.serving(at(2), pool="interactive", revision="rev-a")) == ["w2"]
    assert fleet.capacity(at(2))["interactive", "rev-a"].workers == 1
    fleet.apply(WorkerLeft(worker_id="w2", reason="shutdown"), at(3))
    assert not fleet.serves("interactive", "rev-a", at(3))


def test_a_draining_flag_on_a_heartbeat_is_enough_for_a_late_reader():
    fleet = FleetState()
    fleet.apply(beat("w1", 9, draining=True), at(0))
    assert fleet.serving(at(0)) == [] and ids(fleet.live(at(0))) == ["w1"]


def test_capacity_and_free_slots_are_summed_per_pool_and_revision():
    fleet = FleetState()
    small = Capacity(max_seqs=4, kv_cache_tokens=1000, max_model_len=256)
    fleet.apply(beat("a1", 0, revision="rev-a", free=3, running=5, waiting=1, tps=10.0), at(0))
    fleet.apply(beat("a2", 0, revision="rev-a", free=2, running=6, waiting=0, tps=20.0), at(0))
    fleet.apply(beat("b1", 0, revision="rev-b", capacity=small, free=4), at(0))
    fleet.apply(beat("d1", 0, pool="dedicated-x", revision="rev-a", free=1), at(0))
    fleet.apply(beat("gone", 0, revision="rev-a", free=8), at(0))
    fleet.apply(WorkerLeft(worker_id="gone", reason="shutdown"), at(0.5))
    fleet.apply(beat("quiet", 0, revision="rev-a", free=8), at(-5))  # lost by now
    cap = fleet.capacity(at(1))
    assert set(cap) == {("interactive", "rev-a"), ("interactive", "rev-b"), ("dedicated-x", "rev-a")}
    a = cap["interactive", "rev-a"]
    assert (a.workers, a.max_seqs, a.kv_cache_tokens, a.free_slots, a.running, a.waiting, a.output_tokens_per_s) == \
        (2, 16, 8192, 5, 11, 1, 30.0)
    b = cap["interactive", "rev-b"]
    assert (b.workers, b.max_seqs, b.kv_cache_tokens, b.free_slots) == (1, 4, 1000, 4)
    assert fleet.revisions(at(1)) == {"rev-a", "rev-b"}
    assert fleet.revisions(at(1), pool="dedicated-x") == {"rev-a"}
    assert ids(fleet.serving(at(1), pool="interactive", revision="rev-a")) == ["a1", "a2"]


def test_forget_drops_only_workers_gone_before_the_cutoff():
    fleet = FleetState()
    fleet.apply(joined("left-early"), at(0))
    fleet.apply(WorkerLeft(worker_id="left-early", reason="shutdown"), at(1))
    fleet.apply(joined("silent"), at(2))
    fleet.apply(joined("alive"), at(2))
    fleet.apply(beat("alive", 0), at(100))
    fleet.apply(joined("left-late"), at(0))
    fleet.apply(WorkerLeft(worker_id="left-late", reason="shutdown"), at(60))  # counted from its leave
    assert fleet.forget(at(50)) == 2
    assert ids(fleet.all()) == ["alive", "left-late"]


def test_events_of_other_kinds_are_ignored():
    from models.events_generation import CancelRequested

    fleet = FleetState()
    fleet.apply(CancelRequested(request_id="r1"), at(0))
    fleet.apply(WorkerDraining(worker_id="unknown", reason="x"), at(0))
    fleet.apply(WorkerLeft(worker_id="unknown", reason="x"), at(0))
    assert fleet.all() == []
