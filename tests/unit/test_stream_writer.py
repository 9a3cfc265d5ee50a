"""The worker's stream writer: batching across generations, order, endings, failures."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from models import topics
from models.events import decode, new_event
from models.events_generation import GenerationFailed, GenerationStarted, Timings, TokensEmitted
from workers.stream_writer import StreamWriter


class RecordingLog:
    """Just enough of an EventLog: remembers every append; can be made slow or failing."""

    def __init__(self, delay_s: float = 0.0):
        self.appends: list[tuple[str, list]] = []
        self.delay_s, self.fail = delay_s, False
        self._lock = threading.Lock()

    def append(self, topic, messages):
        time.sleep(self.delay_s)
        if self.fail:
            raise OSError("log unavailable")
        with self._lock:
            self.appends.append((topic, [decode(m.value) for m in messages]))
        return []

    def on(self, topic) -> list:
        return [env for name, envs in self.appends if name == topic.name for env in envs]


def started(request_id: str, tenant: str = "acme"):
    return new_event(GenerationStarted(request_id=request_id, worker_id="w", model_revision="m@1", queued_ms=0),
                     tenant_id=tenant, correlation_id=request_id)


def ending(start):
    return new_event(GenerationFailed(request_id=start.payload.request_id, error_code="engine_error", message="x",
                                      timings=Timings(queued_ms=0)),
                     tenant_id=start.tenant_id, correlation_id=start.correlation_id)


async def seconds(awaitable) -> float:
    """How long `awaitable` took."""
    t0 = time.monotonic()
    await awaitable
    return time.monotonic() - t0


async def appended(log: RecordingLog, events: int, *, within_s: float) -> None:
    """Returns once `events` events are on the stream topic, or after `within_s`."""
    deadline = time.monotonic() + within_s
    while len(log.on(topics.STREAM)) < events and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


@pytest.mark.timing
def test_deltas_of_several_generations_share_an_append_and_keep_their_order():
    log = RecordingLog(delay_s=0.02)  # a slow append: what arrives meanwhile is batched

    async def main():
        writer = StreamWriter(log)
        a, b = started("a"), started("b")
        for i in range(10):
            writer.tokens(a, f"a{i} ", 1)
            writer.tokens(b, f"b{i} ", 1)
            await asyncio.sleep(0.005)
        await writer.finish(a, ending(a))
        await writer.finish(b, ending(b))
        return writer

    writer = asyncio.run(main())
    stream = log.on(topics.STREAM)
    for rid in ("a", "b"):
        mine = [e.payload for e in stream if e.correlation_id == rid]
        tokens = [p for p in mine if isinstance(p, TokensEmitted)]
        assert [t.seq for t in tokens] == list(range(len(tokens))), "seq has no gap and no repeat"
        assert "".join(t.text for t in tokens) == "".join(f"{rid}{i} " for i in range(10)), "nothing lost or reordered"
        assert sum(t.token_count for t in tokens) == 10
        assert isinstance(mine[-1], GenerationFailed), "the end comes after the last tokens"
    assert writer.appends < 20, "deltas that arrive during an append are merged into the next one"
    assert any({e.correlation_id for e in envs} == {"a", "b"} for name, envs in log.appends
               if name == topics.STREAM.name), "one append carries both generations"
    assert [e.correlation_id for e in log.on(topics.OUTCOMES)] == ["a", "b"]


def test_an_end_is_on_the_outcomes_topic_before_its_stream_copy():
    """A client that saw the end on its stream must find it in a status lookup (which
    reads the outcomes topic), wherever it asks next."""
    log = RecordingLog()

    async def main():
        writer = StreamWriter(log)
        a = started("a")
        writer.tokens(a, "last words", 2)
        await writer.finish(a, ending(a))

    asyncio.run(main())
    ends = [(name, i) for i, (name, envs) in enumerate(log.appends)
            for e in envs if isinstance(e.payload, GenerationFailed)]
    assert [name for name, _ in ends] == [topics.OUTCOMES.name, topics.STREAM.name], ends
    assert ends[0][1] < ends[1][1]
    stream = [type(e.payload) for e in log.on(topics.STREAM)]
    assert stream[-2:] == [TokensEmitted, GenerationFailed], "on the stream, the end still follows the last tokens"


@pytest.mark.timing
def test_first_tokens_do_not_wait_for_the_linger_of_others():
    log = RecordingLog()

    async def main():
        writer = StreamWriter(log, linger_s=0.5)
        busy = started("busy")
        writer.tokens(busy, "x", 1)
        await asyncio.sleep(0.02)
        writer.tokens(busy, "y", 1)  # lingers
        await asyncio.sleep(0.01)
        fresh = started("fresh")
        writer.tokens(fresh, "hello", 1)
        waited = await seconds(writer.drain(fresh))
        await writer.finish(busy, ending(busy))
        await writer.finish(fresh, ending(fresh))
        return waited

    waited = asyncio.run(main())
    assert waited < 0.25, f"a first token waited {waited:.3f}s behind another generation's linger"


def test_a_failed_append_is_reported_once_and_the_ending_can_still_be_written():
    log = RecordingLog()

    async def main():
        writer = StreamWriter(log)
        start = started("r")
        log.fail = True
        writer.tokens(start, "lost", 1)
        with pytest.raises(OSError):
            await writer.drain(start)
        log.fail = False
        await writer.finish(start, ending(start))

    asyncio.run(main())
    assert [type(e.payload) for e in log.on(topics.STREAM)] == [GenerationFailed]
    assert [type(e.payload) for e in log.on(topics.OUTCOMES)] == [GenerationFailed]


@pytest.mark.timing
def test_a_lone_stream_lingers_between_its_events():
    log = RecordingLog()

    async def main():
        writer = StreamWriter(log, linger_s=0.05)
        start = started("solo")
        for i in range(20):  # a token every 5 ms: about ten to a 50 ms linger
            writer.tokens(start, f"t{i} ", 1)
            await asyncio.sleep(0.005)
        await writer.finish(start, ending(start))

    asyncio.run(main())
    tokens = [e.payload for e in log.on(topics.STREAM) if isinstance(e.payload, TokensEmitted)]
    assert sum(t.token_count for t in tokens) == 20
    assert tokens[0].token_count == 1, "the first token goes out at once"
    assert len(tokens) <= 6, f"{len(tokens)} events for 20 tokens: later tokens did not linger"


@pytest.mark.timing
def test_another_generations_first_tokens_and_end_do_not_cut_a_linger_short():
    log = RecordingLog()

    async def main():
        writer = StreamWriter(log, linger_s=0.2)
        steady = started("steady")
        writer.tokens(steady, "s0 ", 1)  # its first: out at once
        await asyncio.sleep(0.01)
        for i in range(1, 6):
            writer.tokens(steady, f"s{i} ", 1)
            # a short generation starts and ends meanwhile, each time
            short = started(f"short{i}")
            writer.tokens(short, "x", 1)
            await writer.finish(short, ending(short))
            await asyncio.sleep(0.01)
        await writer.finish(steady, ending(steady))

    asyncio.run(main())
    steady = [e.payload for e in log.on(topics.STREAM)
              if e.correlation_id == "steady" and isinstance(e.payload, TokensEmitted)]
    assert [t.token_count for t in steady] == [1, 5], "its later tokens waited together, on their own clock"
    assert [t.seq for t in steady] == [0, 1]
    shorts = [e.correlation_id for e in log.on(topics.OUTCOMES)]
    assert shorts[:5] == [f"short{i}" for i in range(1, 6)], "the short ones did not wait for it"


def test_the_linger_grows_with_the_generations_streaming():
    log = RecordingLog()

    async def main():
        writer = StreamWriter(log, linger_s=0.4, full_at=4)
        starts = [started(f"g{i}") for i in range(4)]
        writer.tokens(starts[0], "a", 1)
        await asyncio.sleep(0.01)
        alone = writer.linger()
        for start in starts[1:]:
            writer.tokens(start, "b", 1)
        await asyncio.sleep(0.01)
        full = writer.linger()
        for start in starts:
            await writer.finish(start, ending(start))
        return alone, full, writer.linger()

    alone, full, after = asyncio.run(main())
    assert alone == pytest.approx(0.1), "one of four: a quarter of the linger"
    assert full == pytest.approx(0.4)
    assert after == 0, "ended generations no longer count"


@pytest.mark.timing
def test_drain_and_finish_do_not_wait_out_the_linger():
    log = RecordingLog()

    async def main():
        writer = StreamWriter(log, linger_s=5.0)
        start = started("r")
        writer.tokens(start, "first ", 1)
        await writer.drain(start)
        writer.tokens(start, "later", 1)  # would linger 5 s
        drained = await seconds(writer.drain(start))
        writer.tokens(start, " last", 1)
        return drained, await seconds(writer.finish(start, ending(start)))

    drained, finished = asyncio.run(main())
    assert drained < 1.0 and finished < 1.0, (drained, finished)
    text = "".join(e.payload.text for e in log.on(topics.STREAM) if isinstance(e.payload, TokensEmitted))
    assert text == "first later last"


@pytest.mark.timing
def test_the_start_goes_first_at_once_and_the_first_tokens_still_do_not_linger():
    log = RecordingLog()

    async def main():
        writer = StreamWriter(log, linger_s=5.0)
        start = started("r")
        writer.announce(start)
        await appended(log, 1, within_s=1.0)  # well inside the 5 s linger
        announced = [type(e.payload) for e in log.on(topics.STREAM)]
        writer.tokens(start, "hello", 1)  # no drain: that would not let it linger anyway
        first_after = await seconds(appended(log, 2, within_s=2))
        await writer.finish(start, ending(start))
        return announced, first_after

    announced, first_after = asyncio.run(main())
    assert announced == [GenerationStarted], "the start is written without waiting for tokens"
    assert first_after < 1.0, f"the first tokens lingered {first_after:.2f}s after the start"
    assert [type(e.payload) for e in log.on(topics.STREAM)] == [GenerationStarted, TokensEmitted, GenerationFailed]
    assert log.on(topics.STREAM)[1].payload.seq == 0

