"""FleetPresence never stops its worker: failed appends are retried on the next beat with
the join first, and close gives up in bounded time. A fake log, beats called by hand."""
from __future__ import annotations

import threading
import time

from models.events import decode
from models.events_fleet import Capacity
from models.topics import FLEET
from tests.helpers import wait_until
from workers.fleet_presence import FleetPresence, Load, WorkerIdentity

IDENTITY = WorkerIdentity(worker_id="w1", pool="interactive", model_revision="rev-a", engine_config_hash="h",
                          capacity=Capacity(max_seqs=4, kv_cache_tokens=100, max_model_len=64), host="h1", pid=7)
LOAD = Load(running=1, waiting=2, free_slots=3, kv_cache_usage=1.2, output_tokens_per_s=-1.0)


class FakeLog:
    def __init__(self) -> None:
        self.appended: list = []
        self.failing = False
        self.release = threading.Event()
        self.release.set()

    def append(self, topic, messages):
        if not self.release.wait(30):
            raise TimeoutError("never released")
        if self.failing:
            raise ConnectionError("log down")
        assert topic == FLEET.name
        self.appended += [(m.key, decode(m.value).payload) for m in messages]
        return []

    def types(self) -> list[str]:
        return [p.event_type for _, p in self.appended]


def presence(log: FakeLog, **kw) -> FleetPresence:
    # An interval no test waits for: beats are called by hand.
    return FleetPresence(log, IDENTITY, lambda: LOAD, interval_s=3600, **kw)


def test_join_then_heartbeats_keyed_by_worker_with_increasing_seq_and_clamped_load():
    log = FakeLog()
    p = presence(log)
    p.start()
    p.beat()
    p.beat()
    assert log.types() == ["WorkerJoined", "WorkerHeartbeat", "WorkerHeartbeat"]
    assert {key for key, _ in log.appended} == {"w1"}
    joined, first, second = (payload for _, payload in log.appended)
    assert (joined.model_revision, joined.capacity.max_seqs, joined.heartbeat_interval_ms, joined.pid) == \
        ("rev-a", 4, 3_600_000, 7)
    assert (first.seq, second.seq) == (0, 1)
    assert (first.running, first.waiting, first.free_slots) == (1, 2, 3)
    assert (first.kv_cache_usage, first.output_tokens_per_s) == (1.0, 0.0)
    p.close()


def test_a_failed_join_is_sent_again_before_the_next_heartbeat():
    log = FakeLog()
    log.failing = True
    p = presence(log)
    p.start()  # does not raise
    p.beat()
    assert log.appended == []
    log.failing = False
    p.beat()
    assert log.types() == ["WorkerJoined", "WorkerHeartbeat"]
    p.close()


def test_a_failed_heartbeat_is_not_counted_and_the_next_one_goes_out():
    log = FakeLog()
    p = presence(log)
    p.start()
    log.failing = True
    p.beat()
    log.failing = False
    p.beat()
    assert log.types() == ["WorkerJoined", "WorkerHeartbeat"]
    assert log.appended[-1][1].seq == 0
    p.close()


def test_a_load_callback_that_raises_skips_one_beat_only():
    log = FakeLog()
    calls = iter([RuntimeError("engine busy"), LOAD])

    def load():
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value
    p = FleetPresence(log, IDENTITY, load, interval_s=3600)
    p.start()
    p.beat()
    p.beat()
    assert log.types() == ["WorkerJoined", "WorkerHeartbeat"]
    p.close()


def test_draining_is_said_and_repeated_on_every_later_heartbeat():
    log = FakeLog()
    p = presence(log)
    p.start()
    p.beat()
    p.draining("engine_dead")
    p.beat()
    assert log.types() == ["WorkerJoined", "WorkerHeartbeat", "WorkerDraining", "WorkerHeartbeat"]
    assert [payload.draining for _, payload in log.appended if payload.event_type == "WorkerHeartbeat"] == \
        [False, True]
    assert log.appended[2][1].reason == "engine_dead"
    p.close()


def test_close_says_the_worker_left_and_stops_the_beats():
    log = FakeLog()
    p = FleetPresence(log, IDENTITY, lambda: LOAD, interval_s=0.01)
    p.start()
    wait_until(lambda: "WorkerHeartbeat" in log.types(), 10, what="a heartbeat from the thread")
    p.close("shutdown", exit_code=3)
    count = len(log.appended)
    assert log.types()[-1] == "WorkerLeft" and log.appended[-1][1].exit_code == 3
    assert not p._thread.is_alive()  # noqa: SLF001
    assert len(log.appended) == count


def test_close_returns_within_its_timeout_when_the_log_hangs():
    log = FakeLog()
    p = presence(log, close_timeout_s=0.3)
    p.start()
    log.release.clear()  # every append now blocks
    started = time.monotonic()
    p.close()
    assert time.monotonic() - started < 2.0
    log.release.set()
