import asyncio
import threading

import pytest

from tests.helpers import wait_until
from workers.engine import EngineDelta, EngineRequest, InferenceEngine
from workers.engine_runner import EngineRunner


class CountingEngine(InferenceEngine):
    """Emits one token per delta until max_output_tokens; records what happened."""

    def __init__(self) -> None:
        self.loop_thread: threading.Thread | None = None
        self.aborted: list[str] = []
        self.cancelled: list[str] = []
        self.closed_on: threading.Thread | None = None

    async def start(self) -> None:
        self.loop_thread = threading.current_thread()

    async def generate(self, request):
        try:
            for n in range(1, request.max_output_tokens + 1):
                await asyncio.sleep(0)
                if request.request_id in self.aborted:
                    yield EngineDelta(request.request_id, "", 0, n - 1, True, "abort", 1)
                    return
                done = n == request.max_output_tokens
                yield EngineDelta(
                    request.request_id, "x", 1, n, done, "length" if done else None, 1
                )
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled.append(request.request_id)
            raise

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def health(self) -> bool:
        return threading.current_thread() is self.loop_thread

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def engine_config_hash(self) -> str:
        return "counting"

    def close(self) -> None:
        self.closed_on = threading.current_thread()


def req(request_id: str, n: int) -> EngineRequest:
    return EngineRequest(request_id, "p", max_output_tokens=n, tenant_id="t")


def test_engine_runs_on_its_own_loop_thread():
    engine = CountingEngine()
    with EngineRunner(engine) as runner:
        assert engine.loop_thread is not threading.current_thread()
        assert runner.submit(engine.health(), timeout=5) is True
    assert engine.closed_on is engine.loop_thread


def test_stream_yields_every_delta_from_a_plain_thread():
    with EngineRunner(CountingEngine()) as runner:
        deltas = list(runner.stream(req("a", 5), timeout=5))
    assert [d.output_tokens for d in deltas] == [1, 2, 3, 4, 5]
    assert deltas[-1].finished and deltas[-1].finish_reason == "length"


def test_leaving_a_stream_early_cancels_the_generation():
    engine = CountingEngine()
    with EngineRunner(engine) as runner:
        for _ in runner.stream(req("b", 10_000), timeout=5):
            break
        wait_until(lambda: engine.cancelled, 5, what="the generation to be cancelled")
        assert engine.cancelled == ["b"]


def test_engine_errors_reach_the_consumer():
    class Failing(CountingEngine):
        async def generate(self, request):
            yield EngineDelta(request.request_id, "x", 1, 1, False, None, 1)
            raise ValueError("boom")

    with EngineRunner(Failing()) as runner:
        stream = runner.stream(req("c", 3), timeout=5)
        assert next(stream).output_tokens == 1
        with pytest.raises(ValueError, match="boom"):
            next(stream)


def test_closed_runner_refuses_work_and_close_is_idempotent():
    engine = CountingEngine()
    runner = EngineRunner(engine).start()
    runner.close()
    runner.close()
    with pytest.raises(RuntimeError):
        runner.submit(engine.health())


def test_failed_start_stops_the_loop():
    class Broken(CountingEngine):
        async def start(self) -> None:
            raise OSError("no model")

    engine = Broken()
    runner = EngineRunner(engine)
    with pytest.raises(OSError):
        runner.start()
    assert engine.closed_on is not None
    assert not runner._thread.is_alive()


def test_a_stalled_stream_times_out_and_is_cancelled():
    class Stalled(CountingEngine):
        async def generate(self, request):
            try:
                await asyncio.Event().wait()
                yield  # pragma: no cover
            except asyncio.CancelledError:
                self.cancelled.append(request.request_id)
                raise

    engine = Stalled()
    with EngineRunner(engine) as runner:
        with pytest.raises(TimeoutError):
            list(runner.stream(req("d", 3), timeout=0.2))
        wait_until(lambda: engine.cancelled, 5, what="the generation to be cancelled")
        assert engine.cancelled == ["d"]
