"""One writer for all of a worker's token events.

Every generation on the engine hands its deltas to the `StreamWriter`; the writer
appends them to the stream topic in batches: whatever accumulated while the previous
append was in flight goes out in the next one, one `TokensEmitted` per generation per
batch. An engine step yields a delta for every running sequence at once, so a batch
usually carries one event for each of them in a single append, instead of one append
per sequence per step. A generation's first tokens never wait beyond the append in
flight, and later ones wait at most `linger_s` more, so a fast engine is not chopped
into one event per token.

Terminal events go through the same writer (after the generation's last tokens, on the
stream topic, then on the outcomes topic), so readers of the stream see the end right
after the last tokens and settlement follows.

Lives on the engine's event loop; appends run on `io` threads.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field

from models import topics
from models.events import Envelope, caused_by
from models.events_generation import TokensEmitted
from pipelines.eventlog import EventLog
from pipelines.routing import publish


@dataclass
class _Pending:
    started: Envelope
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    first: bool = False  # carries the generation's first tokens: do not linger
    terminal: Envelope | None = None


class StreamWriter:
    def __init__(self, log: EventLog, io: Executor | None = None, *, linger_s: float = 0.0):
        self._log, self._io, self.linger_s = log, io, linger_s
        self._pending: dict[str, _Pending] = {}
        self._seq: dict[str, int] = {}  # next seq by request id, while the generation runs
        self._failed: dict[str, BaseException] = {}
        self._task: asyncio.Task | None = None
        self._batch_done: asyncio.Future | None = None  # resolves when the batch in flight is written
        self._in_flight: set[str] = set()
        self.appends = 0  # stream appends made (for tests and metrics)
        self._urgent = asyncio.Event()  # something that should not linger is pending
        self._last_write = 0.0

    def tokens(self, started: Envelope, text: str, count: int) -> None:
        """Queues a delta of the generation `started` began; raises if an earlier append
        of this generation failed."""
        rid = started.payload.request_id
        if rid in self._failed:
            raise self._failed.pop(rid)
        entry = self._pending.get(rid)
        if entry is None:
            entry = self._pending[rid] = _Pending(started, first=self._seq.get(rid, 0) == 0)
        entry.text.append(text)
        entry.tokens += count
        if entry.first:
            self._urgent.set()
        self._kick()

    async def finish(self, started: Envelope, terminal: Envelope | None) -> None:
        """Writes what is queued for the generation, then `terminal` (if any) to the stream
        and outcomes topics; returns once all of it is on the log. Raises if an append of
        this generation failed (once per failure: a caller that learns of it from `drain`
        may then `finish` with a different ending)."""
        rid = started.payload.request_id
        try:
            if terminal is not None:
                self._pending.setdefault(rid, _Pending(started)).terminal = terminal
                self._urgent.set()
                self._kick()
            while rid in self._pending or rid in self._in_flight:
                await asyncio.shield(self._wait_batch())
            if rid in self._failed:  # reported once: the caller may then write another ending
                raise self._failed.pop(rid)
        finally:
            if terminal is not None:
                self._seq.pop(rid, None)
                self._failed.pop(rid, None)

    async def drain(self, started: Envelope) -> None:
        """Waits until everything queued for the generation is written; raises on failure."""
        await self.finish(started, None)

    def _kick(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def _wait_batch(self) -> None:
        if self._batch_done is None:
            await asyncio.sleep(0)  # the writer task has not picked the batch up yet
        else:
            await self._batch_done

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            if self.linger_s and not any(p.first or p.terminal for p in self._pending.values()):
                wait = self._last_write + self.linger_s - time.monotonic()
                if wait > 0:  # a generation's first tokens or its end cut the wait short
                    self._urgent.clear()
                    try:
                        await asyncio.wait_for(self._urgent.wait(), wait)
                    except asyncio.TimeoutError:
                        pass
            batch, self._pending = self._pending, {}
            self._in_flight = set(batch)
            self._batch_done = loop.create_future()
            self._last_write = time.monotonic()
            try:
                stream, ends = self._events(batch)
                try:
                    if stream:
                        await loop.run_in_executor(self._io, publish, self._log, topics.STREAM, stream)
                        self.appends += 1
                    if ends:
                        # The stream copy first: clients learn the end at once; the outcomes
                        # copy is what settles the reservation.
                        await loop.run_in_executor(self._io, publish, self._log, topics.OUTCOMES, ends)
                except Exception as exc:  # every generation in the batch learns of it
                    for rid in batch:
                        self._failed[rid] = exc
            finally:
                self._in_flight = set()
                done, self._batch_done = self._batch_done, None
                done.set_result(None)

    def _events(self, batch: dict[str, _Pending]) -> tuple[list[Envelope], list[Envelope]]:
        stream, ends = [], []
        for rid, entry in batch.items():
            if rid in self._failed:
                continue
            if entry.tokens or entry.text:
                seq = self._seq.get(rid, 0)
                self._seq[rid] = seq + 1
                stream.append(caused_by(entry.started, TokensEmitted(
                    request_id=rid, seq=seq, text="".join(entry.text), token_count=entry.tokens)))
            if entry.terminal is not None:
                stream.append(entry.terminal)
                ends.append(entry.terminal)
        return stream, ends
