"""One request's stream events in order, each exactly once: what the log already holds
(history) followed by what the hub delivers live.

The subscription is opened before the history is read, so together they cover every
record; live events at or below the last offset handed out are duplicates and dropped.
Offsets only grow within the request's partition, so this is also what makes a resumed
stream have no gap and no repeated `seq`.
"""
from __future__ import annotations

import asyncio
import threading
from collections import defaultdict, deque
from typing import Callable, Iterable

from api.stream_hub import StreamEvent, Subscription
from models import topics
from models.events import EventDecodeError, decode
from models.events_generation import (
    GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationRejected, TokensEmitted,
)
from pipelines.eventlog import EventLog
from pipelines.eventlog.base import Tail

END_TYPES = (GenerationCompleted, GenerationFailed, GenerationCancelled, GenerationRejected)


def is_end(event: StreamEvent) -> bool:
    return isinstance(event.env.payload, END_TYPES)


class StreamTimeout(Exception):
    """No end event before the request's deadline (plus grace)."""


class RequestStream:
    def __init__(self, sub: Subscription, *, after: int, on_event: Callable[[StreamEvent], None] | None = None,
                 on_close: Callable[[], None] | None = None):
        self.sub = sub
        self.after = after  # the last offset handed out (or the offset before the stream starts)
        self.ended = False
        self._buffer: deque[StreamEvent] = deque()
        self._on_event, self._on_close = on_event, on_close
        self._closed = False
        self.tokens_out = 0  # output tokens handed out (to be sent to the client) by this stream

    @property
    def tenant_id(self) -> str:
        return self.sub.tenant_id

    @property
    def request_id(self) -> str:
        return self.sub.request_id

    def add_history(self, events: Iterable[StreamEvent]) -> None:
        last = self._buffer[-1].offset if self._buffer else self.after
        for event in events:
            if event.offset > last:
                self._buffer.append(event)
                last = event.offset

    async def next(self, timeout_s: float) -> StreamEvent:
        """The next event; raises `StreamTimeout` after `timeout_s` without one."""
        if self.ended:
            raise RuntimeError("the stream already ended")
        if self._buffer:
            return self._take(self._buffer.popleft())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                event = await asyncio.wait_for(self.sub.queue.get(), timeout=max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise StreamTimeout() from None
            if event.offset > self.after:
                return self._take(event)

    def ready(self) -> list[StreamEvent]:
        """The events already here, without waiting (so a burst goes out as one write)."""
        out = []
        while not self.ended:
            if self._buffer:
                out.append(self._take(self._buffer.popleft()))
                continue
            try:
                event = self.sub.queue.get_nowait()
            except asyncio.QueueEmpty:
                break
            if event.offset > self.after:
                out.append(self._take(event))
        return out

    def _take(self, event: StreamEvent) -> StreamEvent:
        self.after = event.offset
        self.ended = is_end(event)
        if isinstance(event.env.payload, TokensEmitted):
            self.tokens_out += event.env.payload.token_count
        if self._on_event is not None:
            self._on_event(event)
        return event

    async def events(self, timeout_s: float):
        """Every event up to and including the end event, within `timeout_s` in all."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.ended:
            yield await self.next(deadline - loop.time())

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.sub.close()
            if self._on_close is not None:
                self._on_close()


class StreamHistory:
    """Reads requests' past stream events: one tail per stream partition, kept and moved
    with `seek`, so no reader hops between partitions (on Kafka a hop costs ~100 ms)."""

    def __init__(self, log: EventLog, *, timeout_s: float = 10.0):
        self._log, self._timeout_s = log, timeout_s
        self._tails: dict[int, Tail] = {}
        self._locks: dict[int, threading.Lock] = defaultdict(threading.Lock)

    def read(self, tenant_id: str, request_id: str, partition: int, start: int) -> list[StreamEvent]:
        """The request's events from offset `start` of its partition up to the partition's
        end now, or up to its end event. Other requests' records are skipped by key."""
        with self._locks[partition]:
            tail = self._tail(partition)
            tail.seek(partition, start)
            end = tail.end_offsets()[partition]
            out: list[StreamEvent] = []
            try:
                for record in tail.read_to({partition: end}, timeout_s=self._timeout_s):
                    if record.key != request_id or record.offset >= end:
                        continue
                    try:
                        env = decode(record.value)
                    except EventDecodeError:
                        continue
                    if env.tenant_id == tenant_id and env.correlation_id == request_id:
                        out.append(StreamEvent(record.offset, env))
                        if is_end(out[-1]):
                            return out
            except TimeoutError:
                pass  # what came within the wait; the live stream goes on from there
            return out

    def low_offset(self, partition: int) -> int:
        """The first offset of `partition` the stream topic still retains."""
        with self._locks[partition]:
            return self._tail(partition).low_offsets()[partition]

    def _tail(self, partition: int) -> Tail:
        if partition not in self._tails:
            self._tails[partition] = self._log.tail(topics.STREAM.name, {partition: 0})
        return self._tails[partition]

    def close(self) -> None:
        for tail in self._tails.values():
            tail.close()
        self._tails.clear()
