"""One generation on the engine (`serve_generation`) around its take: nothing is written
before the take commits, a delta the engine gave meanwhile goes out in the start's own
append, and a take that fails leaves no trace."""
from __future__ import annotations

import asyncio
from concurrent.futures import Future
from datetime import datetime, timedelta, timezone

from models import topics
from models.events import new_event
from models.events_generation import (
    GenerationCompleted, GenerationQueued, GenerationRequested, GenerationStarted, Position, TokensEmitted,
)
from tests.fake_engine import FakeEngine
from tests.unit.test_stream_writer import RecordingLog, started
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


def serve_with_take(commits: bool) -> tuple[int, RecordingLog, FakeEngine]:
    """Serves one request whose take resolves (`commits`) only after the engine's delta."""
    log, engine = RecordingLog(), FakeEngine(hold=False)  # one delta at once, then the end

    async def main() -> int:
        writer = StreamWriter(log, linger_s=5.0)
        prompt, taken = Future(), Future()
        prompt.set_result("p")
        serving = asyncio.ensure_future(serve_generation(engine, Cancels(), queued("r"), started("r"), writer,
                                                         prompt, taken))
        while not engine.started:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.02)  # the delta is in hand; the take is still committing
        assert log.appends == [], "nothing is written before the take commits"
        taken.set_result(commits)
        return await serving

    return asyncio.run(main()), log, engine


def test_a_delta_held_through_the_take_goes_out_in_the_starts_append():
    ended, log, _ = serve_with_take(commits=True)
    assert ended == 1
    stream = [[type(e.payload) for e in envs] for name, envs in log.appends if name == topics.STREAM.name]
    assert stream[0][:2] == [GenerationStarted, TokensEmitted], stream
    assert [type(e.payload) for e in log.on(topics.STREAM)] == [GenerationStarted, TokensEmitted,
                                                                GenerationCompleted]


def test_a_take_that_fails_writes_nothing():
    ended, log, engine = serve_with_take(commits=False)
    assert ended == 0 and engine.started == ["r"] and log.appends == []
