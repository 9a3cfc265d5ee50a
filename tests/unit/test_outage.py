"""Riding out an outage (`pipelines.outage`): what is transient, the backoff, readiness said
once per outage, and a run loop that waits an outage out instead of exiting."""
from __future__ import annotations

import logging
import sqlite3
import threading

import pytest
import redis.exceptions
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError
from kafka import errors as kerr
from kombu.exceptions import OperationalError as KombuOperationalError
from prometheus_client import generate_latest
from sqlalchemy.exc import OperationalError

from pipelines.eventlog import EventLogError, Fenced
from pipelines.outage import Backoff, Readiness, is_transient, keep_running, readiness_registry, ride_out
from tests.helpers import wait_until


@pytest.mark.parametrize("exc", [
    kerr.KafkaTimeoutError("frozen"), kerr.KafkaConnectionError("refused"), kerr.NodeNotReadyError(),
    kerr.RequestTimedOutError(), kerr.NotLeaderForPartitionError(), EventLogError("commit failed"),
    Fenced("moved"), sqlite3.OperationalError("database is locked"), ConnectionRefusedError(), TimeoutError(),
    OperationalError("SELECT 1", {}, Exception("server closed the connection")),
    EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), ReadTimeoutError(endpoint_url="http://s3"),
    redis.exceptions.ConnectionError("Connection refused"), KombuOperationalError("Error 111 connecting"),
])
def test_errors_of_a_service_that_may_return_are_transient(exc):
    assert is_transient(exc)


@pytest.mark.parametrize("exc", [ValueError("bug"), KeyError("x"), kerr.UnsupportedVersionError(),
                                 kerr.TopicAuthorizationFailedError()])
def test_bugs_and_refusals_are_not(exc):
    assert not is_transient(exc)


def test_backoff_doubles_from_a_fifth_of_a_second_to_five_seconds_and_resets():
    backoff = Backoff()
    assert [backoff.next() for _ in range(8)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    backoff.reset()
    assert backoff.next() == 0.2


def _ready_gauge(*readiness: Readiness) -> str:
    return generate_latest(readiness_registry(*readiness)).decode()


def test_an_outage_is_said_once_and_its_end_once(caplog):
    readiness = Readiness("admission")
    assert 'ledgerlm_ready{component="admission"} 1.0' in _ready_gauge(readiness)
    with caplog.at_level(logging.WARNING, logger="pipelines.outage"):
        for _ in range(5):
            readiness.down(kerr.KafkaTimeoutError("frozen"))
        assert 'ledgerlm_ready{component="admission"} 0.0' in _ready_gauge(readiness)
        readiness.up()
        readiness.up()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "not ready" in said[0] and "ready again" in said[1], said
    assert readiness.outages == 1 and readiness.serving


def test_a_step_blocked_past_its_stall_bound_is_not_ready():
    readiness = Readiness("worker", stall_s=0.0)
    readiness.busy_since = 0.0  # began long ago (monotonic)
    assert not readiness.serving
    assert 'ledgerlm_ready{component="worker"} 0.0' in _ready_gauge(readiness)


def test_keep_running_waits_an_outage_out_recovering_after_each_failure():
    stop = threading.Event()
    readiness = Readiness("admission")
    calls, recovered, seen_ready = [], [], []

    def step():
        calls.append(1)
        if len(calls) <= 3:
            raise kerr.KafkaTimeoutError("broker frozen")
        seen_ready.append(readiness.ready)
        if len(calls) == 5:
            stop.set()

    keep_running(step, stop, readiness=readiness, recover=lambda: recovered.append(1),
                 backoff=Backoff(first_s=0.001, max_s=0.004))
    assert len(calls) == 5 and len(recovered) == 3
    assert seen_ready == [False, True]  # not ready until a step went through
    assert readiness.ready and readiness.outages == 1


def test_keep_running_survives_a_recovery_that_fails_too():
    stop = threading.Event()
    readiness = Readiness("worker")
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 1:
            raise EventLogError("commit_with failed and was aborted")
        stop.set()

    def recover():
        raise kerr.KafkaTimeoutError("seek to committed timed out")

    keep_running(step, stop, readiness=readiness, recover=recover, backoff=Backoff(first_s=0.001))
    assert len(calls) == 2 and readiness.ready


def test_keep_running_raises_what_is_not_an_outage():
    readiness = Readiness("projector")
    with pytest.raises(ValueError):
        keep_running(lambda: (_ for _ in ()).throw(ValueError("a bug")), threading.Event(), readiness=readiness)


def test_keep_running_stops_when_told_to():
    stop = threading.Event()
    engine_dead = []
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 2:
            engine_dead.append(True)

    keep_running(step, stop, readiness=Readiness("worker"), until=lambda: bool(engine_dead))
    assert len(calls) == 2


class _FrozenAdminTail:
    """An admin-topic tail whose look for the end hangs until `release`, then times out."""

    def __init__(self):
        self.offsets, self.looking, self.release, self.looks = {0: 0}, threading.Event(), threading.Event(), 0

    def end_offsets(self):
        self.looks += 1
        self.looking.set()
        self.release.wait(10)
        raise kerr.KafkaTimeoutError("Failed to get offsets by timestamps in 3000 ms")

    def close(self):
        pass


class _CountingLock:
    def __init__(self, lock):
        self._lock, self.arrived = lock, 0

    def acquire(self, timeout: float = -1) -> bool:
        self.arrived += 1
        return self._lock.acquire(timeout=timeout)

    def release(self) -> None:
        self._lock.release()


class _FrozenLog:
    def __init__(self, tail):
        self._tail = tail

    def tail(self, topic, offsets):
        return self._tail


def test_callers_waiting_for_a_look_at_a_frozen_log_fail_with_it_instead_of_queueing():
    from pipelines.admin.commands import RegistryView

    tail = _FrozenAdminTail()
    view = RegistryView(_FrozenLog(tail))
    view._lock = _CountingLock(view._lock)  # noqa: SLF001
    failures: list[BaseException] = []

    def refresh():
        try:
            view.refresh()
        except Exception as exc:  # noqa: BLE001 - what each caller got is the test
            failures.append(exc)
    first = threading.Thread(target=refresh)
    first.start()
    assert tail.looking.wait(10)
    waiting = [threading.Thread(target=refresh) for _ in range(5)]
    for thread in waiting:
        thread.start()
    wait_until(lambda: view._lock.arrived == 6, 10, what="five callers waiting for the look")  # noqa: SLF001
    tail.release.set()
    for thread in [first, *waiting]:
        thread.join(10)
    assert len(failures) == 6 and all(is_transient(exc) for exc in failures), failures
    assert tail.looks == 1, "callers that waited for the failed look must not each look again"


def test_ride_out_waits_a_transient_error_out_and_says_so_once(caplog):
    readiness, calls = Readiness("batch-worker"), []

    def write():
        calls.append(1)
        if len(calls) <= 3:
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
        return "written"

    with caplog.at_level(logging.WARNING, logger="pipelines.outage"):
        assert ride_out(write, readiness=readiness, deadline_s=10, backoff=Backoff(first_s=0.001)) == "written"
    assert len(calls) == 4 and readiness.ready and readiness.outages == 1
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "not ready" in said[0] and "ready again" in said[1], said


def test_ride_out_raises_past_its_deadline_and_at_once_on_a_bug():
    def refused():
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
    with pytest.raises(EndpointConnectionError):
        ride_out(refused, readiness=Readiness("w"), deadline_s=0.05, backoff=Backoff(first_s=0.01))
    calls = []

    def bug():
        calls.append(1)
        raise ValueError("a bug")
    with pytest.raises(ValueError):
        ride_out(bug, readiness=Readiness("w"), deadline_s=10)
    assert len(calls) == 1
