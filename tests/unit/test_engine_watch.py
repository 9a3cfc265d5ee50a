"""The engine watch: a health call saying unhealthy, vLLM's own dead state, or health calls
left unanswered make the engine dead, once; a closed runner is a shutdown, not a death;
streams waiting on an engine found dead end at once with `EngineDead`, and streams of a
live engine pass through unchanged."""
from __future__ import annotations

import pytest

from tests.dying_engine import DyingEngine
from tests.helpers import wait_until
from workers.engine import EngineDead, EngineError, EngineRequest
from workers.engine_runner import EngineRunner
from workers.engine_watch import EngineWatch, WatchedEngine


@pytest.fixture
def runner():
    runner = EngineRunner(DyingEngine(hold=True), name="dying-engine").start()
    yield runner
    runner.close()


def watched(runner, **options) -> tuple[EngineWatch, list[str]]:
    watch = EngineWatch(runner, runner.engine, **options)
    deaths: list[str] = []
    watch.on_dead(deaths.append)
    return watch, deaths


def request(request_id: str) -> EngineRequest:
    return EngineRequest(request_id=request_id, prompt="p", max_output_tokens=1, tenant_id="acme")


def test_a_health_call_saying_unhealthy_makes_the_engine_dead_once(runner):
    watch, deaths = watched(runner, interval_s=0.05)
    assert watch.check() and not watch.dead
    watch.start()
    try:
        wait_until(lambda: runner.engine.health_calls >= 3, 10, what="health calls on the interval")
        assert not watch.dead
        runner.engine.healthy = False
        assert watch.wait_dead(5), "the watch did not see the unhealthy engine"
        wait_until(lambda: deaths, 5, what="the watch to tell of the death")
        assert len(deaths) == 1 and "unhealthy" in deaths[0]
        assert not watch.check()
        assert len(deaths) == 1
    finally:
        watch.stop()


def test_vllm_s_own_dead_state_is_seen_between_health_calls(runner):
    watch, deaths = watched(runner, interval_s=60.0)  # no health call within the test
    watch.start()
    try:
        runner.submit(runner.engine.crash(), timeout=5)
        assert watch.wait_dead(5)
        wait_until(lambda: deaths, 5, what="the watch to tell of the death")
        assert deaths == ["the engine says it is dead"]
    finally:
        watch.stop()


def test_health_calls_left_unanswered_make_it_dead_only_after_several_in_a_row(runner):
    watch, deaths = watched(runner, timeout_s=0.1, misses=3)
    runner.engine.silent = True
    assert watch.check() and watch.check()  # one slow answer is no death
    runner.engine.silent = False
    assert watch.check()  # an answer starts the count again
    runner.engine.silent = True
    assert watch.check() and watch.check()
    assert not watch.check() and watch.dead
    assert len(deaths) == 1 and "unanswered" in deaths[0]


def test_a_closed_runner_stops_the_watch_without_a_death():
    runner = EngineRunner(DyingEngine(hold=True), name="closing-engine").start()
    watch, deaths = watched(runner, interval_s=0.05)
    watch.start()
    runner.close()
    wait_until(lambda: not watch._thread.is_alive(), 10, what="the watch to stop")
    assert not watch.dead and deaths == []


def collect(runner, engine, request_id: str):
    """The deltas of a stream of `engine` (on the runner's loop), as a future."""
    async def deltas():
        return [delta async for delta in engine.generate(request(request_id))]
    return runner.submit_nowait(deltas())


def test_a_stream_waiting_on_an_engine_found_dead_ends_at_once_and_none_starts_after(runner):
    watch, _ = watched(runner, interval_s=0.05)
    engine = WatchedEngine(runner.engine, watch, runner)
    watch.start()
    try:
        held = collect(runner, engine, "held")
        wait_until(lambda: "held" in runner.engine.started, 10, what="the stream to reach the engine")
        runner.engine.healthy = False  # the engine holds the stream, and will never end it
        with pytest.raises(EngineDead):
            held.result(5)
        with pytest.raises(EngineDead):
            collect(runner, engine, "late").result(5)
        assert runner.engine.started == ["held"], "a stream began on the dead engine"
    finally:
        watch.stop()


def test_streams_vllm_fails_as_its_engine_dies_end_with_engine_dead(runner):
    watch, _ = watched(runner, interval_s=60.0)  # the watch has not looked yet
    engine = WatchedEngine(runner.engine, watch, runner)
    held = collect(runner, engine, "held")
    wait_until(lambda: "held" in runner.engine.started, 10, what="the stream to reach the engine")
    runner.submit(runner.engine.crash(), timeout=5)
    with pytest.raises(EngineDead):
        held.result(5)


class Overloaded(DyingEngine):
    async def generate(self, request):
        raise EngineError("too busy")
        yield


def test_a_live_engine_s_streams_and_errors_pass_unchanged():
    live = EngineRunner(DyingEngine(hold=False), name="live-engine").start()
    busy = EngineRunner(Overloaded(), name="busy-engine").start()
    try:
        watch, _ = watched(live)
        [delta] = collect(live, WatchedEngine(live.engine, watch, live), "quick").result(5)
        assert (delta.text, delta.finished, delta.finish_reason) == ("x", True, "length")
        busy_watch, _ = watched(busy)
        with pytest.raises(EngineError) as raised:
            collect(busy, WatchedEngine(busy.engine, busy_watch, busy), "refused").result(5)
        assert not isinstance(raised.value, EngineDead) and str(raised.value) == "too busy"
    finally:
        live.close()
        busy.close()
