"""Riding out an outage of a backing service (the log, the database, the object store, the
batch queue's broker): what counts as transient, how long to wait before trying again,
and whether a process is ready.

A long-running process's loop (`keep_running`) catches the transient errors of its
adapters, lets the component reopen what must be reopened (`recover`), backs off (0.2 s
doubling to 5 s), says once that the service is gone and once that it is back, and reports
not ready meanwhile (`Readiness`, the `ledgerlm_ready` gauge). Anything else is a bug or a
fatal condition: it is raised, and the process says why and exits non-zero. `ride_out`
does the same for one call (a batch chunk's Parquet write), up to a deadline.
"""
from __future__ import annotations

import logging
import sqlite3
import sys
import threading
import time
from typing import Callable, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pipelines.eventlog.base import EventLogError

logger = logging.getLogger(__name__)
T = TypeVar("T")

# kafka-python's errors that a returning broker cures (besides those marked `retriable`).
_KAFKA_TRANSIENT = ("KafkaTimeoutError", "NoBrokersAvailable", "KafkaConnectionError", "NodeNotReadyError",
                    "RequestTimedOutError", "CoordinatorNotAvailableError", "NotCoordinatorError",
                    "CoordinatorLoadInProgressError", "NotLeaderForPartitionError", "LeaderNotAvailableError",
                    "KafkaUnavailableError", "Cancelled", "StaleMetadata", "IllegalStateError",
                    "UnknownError", "BrokerNotAvailableError", "NotEnoughReplicasError",
                    "ConcurrentTransactionsError")


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` is an error of a backing service that may pass: the log, the database,
    the object store or the broker unreachable, slow or busy. Checked by class name for the
    drivers, so nothing here imports kafka, SQLAlchemy, botocore or redis."""
    if isinstance(exc, (EventLogError, ConnectionError, TimeoutError, sqlite3.OperationalError)):
        return True
    for cls in type(exc).__mro__:
        module = cls.__module__ or ""
        if module.startswith("kafka") and (cls.__name__ in _KAFKA_TRANSIENT or getattr(exc, "retriable", False)):
            return True
        if module.startswith("sqlalchemy") and cls.__name__ in ("OperationalError", "DisconnectionError",
                                                                  "InterfaceError", "TimeoutError"):
            return True
        if module.startswith("psycopg") and cls.__name__ in ("OperationalError", "InterfaceError"):
            return True
        # S3 through s3fs: unreachable, timed out, or the connection closed mid-request.
        if module.startswith("botocore") and cls.__name__ in ("ConnectionError", "HTTPClientError"):
            return True
        # Celery's broker: redis-py's errors, and kombu's wrapping of them.
        if module.startswith(("redis", "kombu")) and cls.__name__ in ("ConnectionError", "TimeoutError",
                                                                      "OperationalError"):
            return True
    return False


class Backoff:
    """Bounded exponential waits: `first_s`, doubling up to `max_s`; `reset` after a success."""

    def __init__(self, first_s: float = 0.2, max_s: float = 5.0):
        self.first_s, self.max_s = first_s, max_s
        self._next = first_s

    def next(self) -> float:
        wait, self._next = self._next, min(self.max_s, self._next * 2)
        return wait

    def reset(self) -> None:
        self._next = self.first_s


class Readiness:
    """Whether a component is serving, and why not. Says once when it goes down and once
    when it is back, however many tries lie between. `readiness_registry` serves the
    `ledgerlm_ready` gauge of one or more (1 ready, 0 not), labelled by component."""

    def __init__(self, component: str, *, ready: bool = True, stall_s: float | None = 15.0):
        """`stall_s`: a step of `keep_running` busy longer than this (a call blocked on a
        frozen broker) also counts as not ready; None: never."""
        self.component, self.stall_s = component, stall_s
        self.busy_since: float | None = None  # monotonic, while `keep_running` runs a step
        self._lock = threading.Lock()
        self.ready = ready
        self.reason: str | None = None
        self.down_since: float | None = None  # monotonic
        self.outages = 0

    def down(self, exc: BaseException | str) -> None:
        why = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        with self._lock:
            first = self.ready or self.down_since is None
            self.ready, self.reason = False, why
            if first:
                self.down_since = time.monotonic()
                self.outages += 1
        if first:
            logger.warning("%s: not ready, a backing service failed (%s); retrying with backoff", self.component, why)

    @property
    def serving(self) -> bool:
        """Ready, and not stuck in a step (what the gauge and a readiness probe say)."""
        busy = self.busy_since
        stalled = self.stall_s is not None and busy is not None and time.monotonic() - busy > self.stall_s
        return self.ready and not stalled

    def up(self) -> None:
        with self._lock:
            if self.ready:
                return
            was, self.ready, self.reason = self.down_since, True, None
            self.down_since = None
        if was is not None:
            logger.warning("%s: ready again after %.1f s", self.component, time.monotonic() - was)


def readiness_registry(*readiness: Readiness) -> CollectorRegistry:
    """One `ledgerlm_ready` gauge over the components of a process (one family, one series each)."""
    registry = CollectorRegistry()
    registry.register(_ReadyGauge(list(readiness)))
    return registry


class _ReadyGauge(Collector):
    def __init__(self, readiness: list[Readiness]):
        self._readiness = readiness

    def collect(self):
        family = GaugeMetricFamily("ledgerlm_ready", "1 while the component serves; 0 while a backing service "
                                   "(log, database) it needs is failing and it retries", labels=["component"])
        for r in self._readiness:
            family.add_metric([r.component], 1.0 if r.serving else 0.0)
        return [family]


def keep_running(step: Callable[[], object], stop: threading.Event, *, readiness: Readiness,
                 recover: Callable[[], None] | None = None, backoff: Backoff | None = None,
                 until: Callable[[], bool] | None = None, healthy: Callable[[], bool] | None = None) -> None:
    """Calls `step` until `stop` is set (or `until()` is true). A transient error marks
    `readiness` down, calls `recover` (which may fail transiently too), waits the next
    backoff and tries again; a step that returns marks it ready (if `healthy()`, where a
    step handles failures of its own). Other errors are raised."""
    backoff = backoff or Backoff()
    while not stop.is_set() and not (until is not None and until()):
        readiness.busy_since = time.monotonic()
        try:
            step()
        except Exception as exc:
            if not is_transient(exc):
                raise
            readiness.down(exc)
            logger.debug("%s: %r", readiness.component, exc)
            if recover is not None:
                try:
                    recover()
                except Exception as again:
                    if not is_transient(again):
                        raise
                    logger.debug("%s: recovering failed too: %r", readiness.component, again)
            readiness.busy_since = None
            stop.wait(backoff.next())
            continue
        finally:
            readiness.busy_since = None
        if healthy is not None and not healthy():
            continue
        if not readiness.ready:
            readiness.up()
        backoff.reset()


def ride_out(call: Callable[[], T], *, readiness: Readiness, deadline_s: float,
             backoff: Backoff | None = None) -> T:
    """`call()`'s result, waiting out its transient errors with backoff (`readiness` down
    meanwhile, said once) for up to `deadline_s`; then, or on any other error, it raises."""
    backoff, give_up = backoff or Backoff(), time.monotonic() + deadline_s
    while True:
        try:
            result = call()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() >= give_up:
                raise
            readiness.down(exc)
            logger.debug("%s: %r", readiness.component, exc)
            time.sleep(min(backoff.next(), max(0.0, give_up - time.monotonic())))
            continue
        readiness.up()
        return result


def exit_on_fatal(process: str, exc: BaseException, code: int = 70) -> int:
    """What a process that cannot go on says on stderr; returns its exit code (70: EX_SOFTWARE)."""
    print(f"ledgerlm serve {process}: stopping on an error it cannot ride out: {type(exc).__name__}: {exc}",
          file=sys.stderr, flush=True)
    return code
