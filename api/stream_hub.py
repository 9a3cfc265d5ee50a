"""One follower of the stream topic per API process, fanning records out to the
requests being streamed to clients of this process.

A record is handed only to subscribers of its request *and* its tenant: request ids
may be chosen by clients, so two tenants can pick the same one. Records nobody here
waits for are skipped by their key (the request id) without being decoded.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

from models import topics
from models.events import Envelope, EventDecodeError, decode
from pipelines.eventlog import EventLog
from pipelines.outage import Readiness, is_transient

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamEvent:
    offset: int  # in the request's stream partition: the SSE id
    env: Envelope


class Subscription:
    def __init__(self, hub: "StreamHub", tenant_id: str, request_id: str, loop: asyncio.AbstractEventLoop):
        self.tenant_id, self.request_id = tenant_id, request_id
        self.queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self._hub, self.loop = hub, loop

    def put_all(self, events: list[StreamEvent]) -> None:
        for event in events:
            self.queue.put_nowait(event)

    def close(self) -> None:
        self._hub.unsubscribe(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _deliver_on_loop(batches: list[tuple[Subscription, list[StreamEvent]]]) -> None:
    for sub, events in batches:
        sub.put_all(events)


def deliver_all(batches: dict[Subscription, list[StreamEvent]]) -> None:
    """Hands every subscriber its batch with one wake-up per event loop, not one per
    subscriber: a poll that carries tokens of hundreds of streams wakes the API's loop once."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Subscription, list[StreamEvent]]]] = {}
    for sub, events in batches.items():
        by_loop.setdefault(sub.loop, []).append((sub, events))
    for loop, work in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver_on_loop, work)
        except RuntimeError:  # that loop closed (its server stopped): nobody is left to read
            pass


class StreamHub:
    def __init__(self, log: EventLog, *, idle_wait_s: float = 0.05):
        self._log = log
        self._idle_wait_s = idle_wait_s
        self._subs: dict[str, list[Subscription]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tail = None
        self.readiness = Readiness("api-stream", stall_s=None)  # whether the stream topic is being followed
        self._positions: dict[int, int] = {}
        self.partitions = 0

    def start(self) -> None:
        self.partitions = self._log.partitions(topics.STREAM.name)
        ends = {p: self._log.end_offset(topics.STREAM.name, p) for p in range(self.partitions)}
        self._positions = dict(ends)
        self._tail = self._log.tail(topics.STREAM.name, ends)
        self._thread = threading.Thread(target=self._run, name="stream-hub", daemon=True)
        self._thread.start()

    def position(self, partition: int) -> int:
        """An offset of `partition` that every record the hub has yet to deliver is at or after:
        a stream that starts after this call starts at or after it."""
        return self._positions[partition]

    def subscribe(self, tenant_id: str, request_id: str) -> Subscription:
        sub = Subscription(self, tenant_id, request_id, asyncio.get_running_loop())
        with self._lock:
            self._subs.setdefault(request_id, []).append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.request_id, [])
            if sub in subs:
                subs.remove(sub)
            if not subs:
                self._subs.pop(sub.request_id, None)

    def subscribers(self, tenant_id: str, request_id: str) -> int:
        with self._lock:
            return sum(1 for s in self._subs.get(request_id, ()) if s.tenant_id == tenant_id)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                records = self._tail.poll(max_records=1000, timeout_s=self._idle_wait_s)
            except Exception as exc:  # a log hiccup must not end streaming for the process
                if is_transient(exc):
                    self.readiness.down(exc)  # said once per outage
                else:
                    logger.exception("stream follower failed to read; retrying")
                self._stop.wait(0.5)
                continue
            if not self.readiness.ready:
                self.readiness.up()
            batches: dict[Subscription, list[StreamEvent]] = {}
            for record in records:
                for sub, event in self._route(record):
                    batches.setdefault(sub, []).append(event)
                self._positions[record.partition] = record.offset + 1
            deliver_all(batches)

    def _route(self, record) -> list[tuple[Subscription, StreamEvent]]:
        """Who this record goes to: decided now, so a later subscriber never gets it."""
        with self._lock:
            if record.key not in self._subs:
                return []
        try:
            env = decode(record.value)
        except EventDecodeError:
            return []
        with self._lock:
            subs = [s for s in self._subs.get(env.correlation_id, ()) if s.tenant_id == env.tenant_id]
        event = StreamEvent(record.offset, env)
        return [(sub, event) for sub in subs]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._tail is not None:
            self._tail.close()
