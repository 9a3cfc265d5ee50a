"""One generation on the engine (`serve_generation`) around its take: nothing is written
before the take commits, a delta the engine gave meanwhile goes out in the start's own
append, and a take that fails leaves no trace. A log that goes away mid-stream ends it
as the log's failure, with what reached the stream."""
from __future__ import annotations

import asyncio
from concurrent.futures import Future
from datetime import datetime, timedelta, timezone

from kafka.errors import KafkaTimeoutError

from models import topics
from models.events import new_event
from models.events_generation import (
    GenerationCompleted, GenerationFailed, GenerationQueued, GenerationRequested, GenerationStarted, Position,
    TokensEmitted,
)
from tests.fake_engine import FakeEngine
from tests.unit.test_stream_writer import RecordingLog, started
from workers.engine import EngineDelta
from workers.generation import serve_generation
from workers.stream_writer import StreamWriter


class Cancels:
    def __init__(self):
        self.in_flight: dict[str, str] = {}
        self.cancelled: dict[str, str] = {}

    def expire(self, request_id: str) -> None:
        self.in_flight[request_id] = "deadline"


def queued(request_id: str):
    now = datetime.now(timezone.utc)
    req = GenerationRequested(request_id=request_id, model_alias="fake", model_revision="m@1", input_tokens=1,
                              input_sha256="0" * 64, max_output_tokens=1, deadline_at=now + timedelta(seconds=60),
                              prompt_ref=Position(topic="p", partition=0, offset=0))
    return new_event(GenerationQueued(request=req, reservation_id="res", queued_at=now), tenant_id="acme",
                     correlation_id=request_id)


class HandingEngine(FakeEngine):
    """A `FakeEngine` that says when it has handed a delta to the generation."""

    def __init__(self):
        super().__init__(hold=False)  # one delta at once, then the end
        self.handed = asyncio.Event()

    async def generate(self, request):
        async for delta in super().generate(request):
            self.handed.set()  # the generation has the delta once this yield returns to it
            yield delta


class WatchedWriter(StreamWriter):
    """A `StreamWriter` that remembers what the generation queued on it."""

    def __init__(self, log):
        super().__init__(log, linger_s=5.0)
        self.queued: list[str] = []

    def announce(self, started):
        self.queued.append("announce")
        super().announce(started)

    def tokens(self, started, text, count, logprobs=None):
        self.queued.append("tokens")
        super().tokens(started, text, count, logprobs)


def serve_with_take(commits: bool) -> tuple[int, RecordingLog, HandingEngine, WatchedWriter]:
    """Serves one request whose take resolves (`commits`) only after the engine's delta."""
    log, engine = RecordingLog(), HandingEngine()

    async def main() -> tuple[int, WatchedWriter]:
        writer = WatchedWriter(log)
        prompt, taken = Future(), Future()
        prompt.set_result("p")
        serving = asyncio.ensure_future(serve_generation(engine, Cancels(), queued("r"), started("r"), writer,
                                                         prompt, taken))
        await asyncio.wait_for(engine.handed.wait(), timeout=10)  # the take is still committing
        assert writer.queued == [] and log.appends == [], "nothing is written before the take commits"
        taken.set_result(commits)
        return await asyncio.wait_for(serving, timeout=10), writer

    ended, writer = asyncio.run(main())
    return ended, log, engine, writer


def test_a_delta_held_through_the_take_goes_out_in_the_starts_append():
    ended, log, _, writer = serve_with_take(commits=True)
    assert ended == 1 and writer.queued[:2] == ["announce", "tokens"]
    stream = [[type(e.payload) for e in envs] for name, envs in log.appends if name == topics.STREAM.name]
    assert stream[0][:2] == [GenerationStarted, TokensEmitted], stream
    assert [type(e.payload) for e in log.on(topics.STREAM)] == [GenerationStarted, TokensEmitted,
                                                                GenerationCompleted]


def test_a_take_that_fails_writes_nothing():
    ended, log, engine, writer = serve_with_take(commits=False)
    assert ended == 0 and engine.started == ["r"] and writer.queued == [] and log.appends == []


class CountingEngine(FakeEngine):
    """`tokens` deltas of one token each, a little apart, then the end."""

    def __init__(self, tokens: int):
        super().__init__(hold=False)
        self.tokens = tokens

    async def generate(self, request):
        self.started.append(request.request_id)
        for i in range(self.tokens):
            await asyncio.sleep(0.005)
            yield EngineDelta(request.request_id, "x", 1, i + 1, i + 1 == self.tokens, "length")


class BrokerGoneLog(RecordingLog):
    """The broker goes away after `good` stream appends: the next `down` appends (of any
    topic) time out as kafka-python's producer does, then it is back."""

    def __init__(self, good: int, down: int):
        super().__init__()
        self.good, self.down, self.refused = good, down, 0

    def append(self, topic, messages):
        if topic == topics.STREAM.name and self.good > 0:
            self.good -= 1
        elif self.good == 0 and self.refused < self.down:
            self.refused += 1
            raise KafkaTimeoutError("Batch for TopicPartition(topic='ledgerlm.stream') containing 1 record(s) "
                                    "expired")
        return super().append(topic, messages)


def test_a_broker_gone_mid_stream_ends_the_generation_as_the_logs_failure_with_what_was_delivered():
    log, engine = BrokerGoneLog(good=3, down=2), CountingEngine(tokens=50)

    async def main() -> int:
        writer = StreamWriter(log)
        prompt, taken = Future(), Future()
        prompt.set_result("p")
        taken.set_result(True)
        return await asyncio.wait_for(serve_generation(engine, Cancels(), queued("r"), started("r"), writer,
                                                       prompt, taken), timeout=30)

    assert asyncio.run(main()) == 1
    assert log.refused == 2  # the end itself met the outage once, and was written when the log came back
    [failed] = [e.payload for e in log.on(topics.OUTCOMES)]
    assert isinstance(failed, GenerationFailed), failed
    assert failed.error_code == "log_unavailable" and "KafkaTimeoutError" in failed.message, failed
    on_stream = sum(e.payload.token_count for e in log.on(topics.STREAM) if isinstance(e.payload, TokensEmitted))
    assert 0 < on_stream < failed.output_tokens < 50, (on_stream, failed.output_tokens)
    assert failed.delivered_output_tokens == on_stream
    assert [type(e.payload) for e in log.on(topics.STREAM)][-1] is GenerationFailed
