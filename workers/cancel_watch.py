"""Follows the requests topic for `CancelRequested`: aborts cancelled requests in flight,
and remembers recent cancels so queued work that was cancelled never starts.

It runs in its own thread (`start`) and follows every partition of the requests topic
through one tail (on Kafka, one consumer long-polling them all), so a cancel is seen
within a fetch of being written, and the worker's loop never waits for it."""
from __future__ import annotations

import logging
import threading
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
    WAIT_S = 0.1  # the longest one look waits for new records (it returns at the first)
    # Between two looks: the requests topic changes with every request, and a cancel may
    # wait this long; reading at each change would cost the worker more than cancels do.
    GAP_S = 0.005
    CANCEL_TYPE = b'"CancelRequested"'  # in the record of every cancel (events are JSON)

    def __init__(self, log: EventLog, runner: EngineRunner, engine: InferenceEngine):
        self._log, self._runner, self._engine = log, runner, engine
        self.in_flight: dict[str, str] = {}  # request_id -> reason once cancelled, "" before
        self.cancelled: OrderedDict[str, str] = OrderedDict()  # request_id -> reason
        self.delivered: dict[str, int] = {}  # request_id -> tokens its client got, when it went away
        self._new: set[str] = set()
        self._tail = log.tail(topics.REQUESTS.name, {
            p: log.end_offset(topics.REQUESTS.name, p) for p in range(log.partitions(topics.REQUESTS.name))})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, name: str = "cancel-watch") -> None:
        def run() -> None:
            while not self._stop.is_set():
                try:
                    self.poll()
                except Exception:  # a log hiccup must not stop cancels for good
                    logger.exception("reading cancels failed; retrying")
                    self._stop.wait(self.WAIT_S)
                self._stop.wait(self.GAP_S)

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._tail.close()

    def poll(self, timeout_s: float | None = None) -> None:
        records = self._tail.poll(max_records=1000, timeout_s=self.WAIT_S if timeout_s is None else timeout_s)
        for record in records:
            if self.CANCEL_TYPE not in record.value:
                continue  # most of the topic is requests: not decoded
            try:
                env = decode(record.value)
            except EventDecodeError:
                continue
            if not isinstance(env.payload, CancelRequested):
                continue
            request_id, reason = env.payload.request_id, env.payload.reason
            self.cancelled[request_id] = reason
            if env.payload.delivered_output_tokens is not None:
                self.delivered[request_id] = env.payload.delivered_output_tokens
            self._new.add(request_id)
            if len(self.cancelled) > self.REMEMBER:
                self.delivered.pop(self.cancelled.popitem(last=False)[0], None)
            if request_id in self.in_flight and not self.in_flight[request_id]:
                self.in_flight[request_id] = reason
                self._runner.submit_nowait(self._engine.abort(request_id))

    def pending_for(self, queued: dict) -> bool:
        """Whether a cancel seen since the last call is for work still queued."""
        new, self._new = self._new, set()
        return any(request_id in queued for request_id in list(new))

    def untaken(self, request_id: str) -> None:
        """Aborts work that began while its take was committing, when that commit failed:
        it ends without a word on the log, and whoever owns the work next runs it."""
        if request_id in self.in_flight:
            self.in_flight[request_id] = "untaken"
            self._runner.submit_nowait(self._engine.abort(request_id))

    def expire(self, request_id: str) -> None:
        """Aborts running work whose deadline has come."""
        if request_id in self.in_flight and not self.in_flight[request_id]:
            self.in_flight[request_id] = "deadline"
            self._runner.submit_nowait(self._engine.abort(request_id))
