"""One follower of the stream topic per API process, fanning records out to the
requests being streamed to clients of this process."""
from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

from models import topics
from models.events import Envelope, EventDecodeError, decode
from pipelines.eventlog import EventLog

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamEvent:
    offset: int
    env: Envelope


class Subscription:
    def __init__(self, hub: "StreamHub", request_id: str, loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self.queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self._hub, self._loop = hub, loop

    def deliver(self, event: StreamEvent) -> None:
        self._loop.call_soon_threadsafe(self.queue.put_nowait, event)

    def close(self) -> None:
        self._hub.unsubscribe(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class StreamHub:
    def __init__(self, log: EventLog, *, idle_wait_s: float = 0.05):
        self._log = log
        self._idle_wait_s = idle_wait_s
        self._subs: dict[str, list[Subscription]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tail = None

    def start(self) -> None:
        n = self._log.partitions(topics.STREAM.name)
        self._tail = self._log.tail(topics.STREAM.name, {p: self._log.end_offset(topics.STREAM.name, p) for p in range(n)})
        self._thread = threading.Thread(target=self._run, name="stream-hub", daemon=True)
        self._thread.start()

    def subscribe(self, request_id: str) -> Subscription:
        sub = Subscription(self, request_id, asyncio.get_running_loop())
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

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                records = self._tail.poll(max_records=1000, timeout_s=self._idle_wait_s)
            except Exception:  # a log hiccup must not end streaming for the process
                logger.exception("stream follower failed to read; retrying")
                self._stop.wait(0.5)
                continue
            for record in records:
                with self._lock:
                    if not self._subs:
                        continue
                try:
                    env = decode(record.value)
                except EventDecodeError:
                    continue
                with self._lock:
                    subs = list(self._subs.get(env.correlation_id, ()))
                for sub in subs:
                    sub.deliver(StreamEvent(record.offset, env))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._tail is not None:
            self._tail.close()
