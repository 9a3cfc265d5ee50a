"""Follows the requests topic for `CancelRequested`: aborts cancelled requests in flight,
and remembers recent cancels so queued work that was cancelled never starts.

It runs in its own thread (`start`): looking at every partition of the requests topic
takes a round trip per partition on Kafka, which the worker's loop should not wait for."""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

from models import topics
from models.events import EventDecodeError, decode
from models.events_generation import CancelRequested
from pipelines.eventlog import EventLog
from workers.engine import InferenceEngine
from workers.engine_runner import EngineRunner

logger = logging.getLogger(__name__)


class CancelWatch:
    REMEMBER = 50_000  # recent cancels kept for queued work; older ones have long expired
    EVERY_S = 0.05  # at most this often: cancels are rare and looking at every partition is not free

    def __init__(self, log: EventLog, runner: EngineRunner, engine: InferenceEngine):
        self._log, self._runner, self._engine = log, runner, engine
        self.in_flight: dict[str, str] = {}  # request_id -> reason once cancelled, "" before
        self.cancelled: OrderedDict[str, str] = OrderedDict()  # request_id -> reason
        self._new: set[str] = set()
        self._next_poll = 0.0
        self._next = {p: log.end_offset(topics.REQUESTS.name, p) for p in range(log.partitions(topics.REQUESTS.name))}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, name: str = "cancel-watch") -> None:
        def run() -> None:
            while not self._stop.is_set():
                try:
                    self.poll()
                except Exception:  # a log hiccup must not stop cancels for good
                    logger.exception("reading cancels failed; retrying")
                self._stop.wait(self.EVERY_S)  # the pace of looking, not a synchronisation

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def poll(self) -> None:
        if time.monotonic() < self._next_poll:
            return
        self._next_poll = time.monotonic() + self.EVERY_S
        for record in self._new_records():
            try:
                env = decode(record.value)
            except EventDecodeError:
                continue
            if not isinstance(env.payload, CancelRequested):
                continue
            request_id, reason = env.payload.request_id, env.payload.reason
            self.cancelled[request_id] = reason
            self._new.add(request_id)
            if len(self.cancelled) > self.REMEMBER:
                self.cancelled.popitem(last=False)
            if request_id in self.in_flight and not self.in_flight[request_id]:
                self.in_flight[request_id] = reason
                self._runner.submit_nowait(self._engine.abort(request_id))

    def _new_records(self) -> list:
        # Where a partition ends is one cheap question; a read that finds nothing is not
        # (on Kafka it waits out a fetch), and most partitions have nothing new.
        records = []
        for partition, offset in self._next.items():
            if self._log.end_offset(topics.REQUESTS.name, partition) <= offset:
                continue
            batch = self._log.read(topics.REQUESTS.name, partition, offset, max_records=1000)
            if batch:
                self._next[partition] = batch[-1].offset + 1
                records += batch
        return records

    def pending_for(self, queued: dict) -> bool:
        """Whether a cancel seen since the last call is for work still queued."""
        new, self._new = self._new, set()
        return any(request_id in queued for request_id in list(new))

    def expire(self, request_id: str) -> None:
        """Aborts running work whose deadline has come."""
        if request_id in self.in_flight and not self.in_flight[request_id]:
            self.in_flight[request_id] = "deadline"
            self._runner.submit_nowait(self._engine.abort(request_id))
