"""One writer for all of a worker's token events.

Every generation on the engine hands its deltas to the `StreamWriter`; the writer
appends them to the stream topic in batches: whatever is due when an append can start
goes out in one append, one `TokensEmitted` per generation. An engine step yields a
delta for every running sequence at once, so a batch usually carries one event for each
of them, instead of one append per sequence per step.

A generation's first tokens, its end and a `drain` go out at once (behind the append in
flight, if any). Its other tokens may wait up to the linger, so that one event carries
several of them: every event costs the worker, the log, the API and the client a
decode and an encode, and on a busy machine that CPU is taken from the engine. The
linger scales with how busy the writer is: `linger_s` with `full_at` generations
streaming, proportionally less with fewer, so a lone stream goes out almost token by
token and a full engine streams in larger pieces. Each generation lingers on its own
clock: another's first tokens or end do not cut its wait short.

The stream copy of a generation's `GenerationStarted` goes through it too (`announce`,
once the take is committed): the take's transaction then spans no stream partition. On
Kafka, an open transaction hides everything after its first record on a partition from
`read_committed` readers, so a take in flight would hold back every other generation's
tokens on that partition until its markers land. Terminal events go through the writer
as well: on the outcomes topic, then on the stream topic right after the generation's last
tokens. A client that has seen the end on its stream then finds it in every status lookup
(which reads the outcomes topic), and a failed stream append never leaves a generation
its client saw end unsettled.

Lives on the engine's event loop; appends run on `io` threads.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field

from models import topics
from models.events import Envelope, caused_by
from models.events_generation import TokenLogprob, TokensEmitted, TopLogprob
from pipelines.eventlog import EventLog
from pipelines.publish import publish


@dataclass
class _Pending:
    started: Envelope
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    logprobs: list[TokenLogprob] | None = None  # only for a generation that asked for them
    since: float = 0.0  # when its oldest unwritten text came
    now: bool = False  # first tokens, an end or a drain: goes out with the next append
    announce: bool = False  # the stream copy of `started` goes first
    terminal: Envelope | None = None


def _as_event(t) -> TokenLogprob:
    return TokenLogprob(token=t.token, logprob=t.logprob, top=tuple(TopLogprob(token=a, logprob=lp) for a, lp in t.top))


class StreamWriter:
    def __init__(self, log: EventLog, io: Executor | None = None, *, linger_s: float = 0.0, full_at: int = 1):
        self._log, self._io, self.linger_s, self.full_at = log, io, linger_s, max(1, full_at)
        self._pending: dict[str, _Pending] = {}
        self._seq: dict[str, int] = {}  # next seq by request id, while the generation runs
        self._failed: dict[str, BaseException] = {}
        self._written: dict[str, int] = {}  # output tokens on the stream topic, by request id
        self._task: asyncio.Task | None = None
        self._batch_done: asyncio.Future | None = None  # resolves when the batch in flight is written
        self._in_flight: set[str] = set()
        self.appends = 0  # stream appends made (for tests and metrics)
        self.output_tokens = 0  # tokens handed to it, for the worker's heartbeat rate
        self._urgent = asyncio.Event()  # something that should not linger is pending

    def tokens(self, started: Envelope, text: str, count: int, logprobs=None) -> None:
        """Queues a delta of the generation `started` began, with its tokens' log
        probabilities (`workers.engine.TokenLogprob`s) if it asked for them; raises if an
        earlier append of this generation failed."""
        rid = started.payload.request_id
        if rid in self._failed:
            raise self._failed.pop(rid)
        entry = self._pending.get(rid)
        if entry is None:
            entry = self._pending[rid] = _Pending(started, since=time.monotonic(), now=self._seq.get(rid, 0) == 0)
            self._seq.setdefault(rid, 0)
        entry.text.append(text)
        entry.tokens += count
        if logprobs is not None:
            entry.logprobs = entry.logprobs or []
            entry.logprobs.extend(_as_event(t) for t in logprobs)
        self.output_tokens += count
        if entry.now:
            self._urgent.set()
        self._kick()

    def announce(self, started: Envelope) -> None:
        """Queues the stream copy of `started` (the generation's take is committed), ahead
        of anything else of the generation; it does not linger."""
        rid = started.payload.request_id
        entry = self._pending.setdefault(rid, _Pending(started, since=time.monotonic()))
        entry.announce = entry.now = True
        self._seq.setdefault(rid, 0)
        self._urgent.set()
        self._kick()

    def linger(self) -> float:
        """How long a generation's later tokens may wait now: `linger_s` scaled by the
        generations streaming, up to `full_at` of them."""
        return self.linger_s * min(1.0, len(self._seq) / self.full_at)

    async def finish(self, started: Envelope, terminal: Envelope | None) -> None:
        """Writes what is queued for the generation, then `terminal` (if any) to the stream
        and outcomes topics; returns once all of it is on the log. Raises if an append of
        this generation failed (once per failure: a caller that learns of it from `drain`
        may then `finish` with a different ending)."""
        rid = started.payload.request_id
        try:
            entry = self._pending.get(rid)
            if terminal is not None:
                entry = self._pending.setdefault(rid, _Pending(started))
                entry.terminal = terminal
            if entry is not None:  # what it waits for does not linger
                entry.now = True
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
                self._written.pop(rid, None)

    def written(self, request_id: str) -> int:
        """Output tokens of the generation on the stream topic so far (until its end is written)."""
        return self._written.get(request_id, 0)

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
            batch = self._due()
            if not batch:  # everything lingers: until the oldest is due, or something is urgent
                self._urgent.clear()
                wait = min(e.since for e in self._pending.values()) + self.linger() - time.monotonic()
                try:
                    await asyncio.wait_for(self._urgent.wait(), max(0.0, wait))
                except asyncio.TimeoutError:
                    pass
                continue
            self._in_flight = set(batch)
            self._batch_done = loop.create_future()
            try:
                stream, ends = self._events(batch)
                try:
                    if ends:
                        # The outcomes copy first: it settles the reservation and is what a
                        # status lookup reads, so a client that has seen the end on its
                        # stream finds the generation ended wherever it asks.
                        await loop.run_in_executor(self._io, publish, self._log, topics.OUTCOMES, ends)
                    if stream:
                        await loop.run_in_executor(self._io, publish, self._log, topics.STREAM, stream)
                        self.appends += 1
                        for rid, entry in batch.items():
                            if rid not in self._failed and entry.tokens:
                                self._written[rid] = self._written.get(rid, 0) + entry.tokens
                except Exception as exc:  # every generation in the batch learns of it
                    for rid in batch:
                        self._failed[rid] = exc
            finally:
                self._in_flight = set()
                done, self._batch_done = self._batch_done, None
                done.set_result(None)

    def _due(self) -> dict[str, _Pending]:
        """Takes the entries that may not wait any longer out of the pending ones."""
        cut = time.monotonic() - self.linger()
        due = {rid: e for rid, e in self._pending.items() if e.now or e.since <= cut}
        for rid in due:
            del self._pending[rid]
        return due

    def _events(self, batch: dict[str, _Pending]) -> tuple[list[Envelope], list[Envelope]]:
        stream, ends = [], []
        for rid, entry in batch.items():
            if rid in self._failed:
                continue
            if entry.announce:
                stream.append(entry.started)
            if entry.tokens or entry.text:
                seq = self._seq.get(rid, 0)
                self._seq[rid] = seq + 1
                stream.append(caused_by(entry.started, TokensEmitted(
                    request_id=rid, seq=seq, text="".join(entry.text), token_count=entry.tokens,
                    logprobs=None if entry.logprobs is None else tuple(entry.logprobs))))
            if entry.terminal is not None:
                stream.append(entry.terminal)
                ends.append(entry.terminal)
        return stream, ends
