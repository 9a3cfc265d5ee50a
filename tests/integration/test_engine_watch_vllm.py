"""The engine watch on a real vLLM engine: its EngineCore process killed mid-stream, the
watch finds the engine dead within seconds and the stream in flight ends with `EngineDead`;
inside a live worker, its running generations fail and settle and its queued work moves to
the other worker. Each test starts an engine of its own (never the session's shared one),
and reaps it."""
from __future__ import annotations

import time
import uuid

import pytest

from tests.conftest import make_log_opener
from tests.e2e.test_engine_health import (
    SETTLED_WITHIN_S, Fleet, one_assignment_each, settled, starts_by, terminal_of,
)
from tests.engine_fixture import engine_processes, tiny_engine_config
from tests.engine_wrappers import ThrottledEngine
from tests.fake_engine import FakeEngine
from tests.helpers import wait_until
from workers.engine import EngineDead, EngineRequest
from workers.engine_runner import EngineRunner
from workers.engine_watch import EXIT_ENGINE_DEAD, EngineWatch, WatchedEngine
from workers.vllm_engine import VllmEngine


SEEN_WITHIN_S = 5.0


def test_a_killed_engine_core_is_found_dead_within_seconds_and_its_stream_ends(tiny_model_dir, own_vllm):
    before = {p.pid for p in engine_processes()}  # the session engine's, if started
    engine = VllmEngine(tiny_engine_config(tiny_model_dir))
    with EngineRunner(engine, name="doomed-engine") as runner:
        watch = EngineWatch(runner, engine, interval_s=1.0)
        # Paced: 400 tokens take 20 s, so the stream is in flight when the engine dies.
        watched = WatchedEngine(ThrottledEngine(engine, 0.05), watch, runner)
        deltas: list = []

        async def stream():
            request = EngineRequest(request_id=f"doomed-{uuid.uuid4().hex[:8]}", prompt="A long story",
                                    max_output_tokens=400, tenant_id="tenant-a", ignore_eos=True)
            async for delta in watched.generate(request):
                deltas.append(delta)

        assert watch.check()
        watch.start()
        try:
            in_flight = runner.submit_nowait(stream())
            wait_until(lambda: deltas, 60, what="the stream's first delta")
            [core] = [p for p in engine_processes() if p.pid not in before and p.name().startswith("VLLM::EngineCor")]
            core.kill()
            killed_at = time.monotonic()
            assert watch.wait_dead(30), "the watch never found the engine dead"
            seen_after_s = time.monotonic() - killed_at
            with pytest.raises(EngineDead):
                in_flight.result(10)
        finally:
            watch.stop()
    assert seen_after_s < SEEN_WITHIN_S, f"the engine was found dead {seen_after_s:.1f}s after its core died"
    assert len(deltas) < 400, "the stream ran to its end on a dead engine"
    assert not [p for p in engine_processes() if p.pid not in before], "vLLM processes outlived the engine"


def test_a_worker_whose_engine_core_is_killed_fails_its_running_work_and_its_queue_moves(tiny_model_dir, tmp_path, own_vllm):
    """The issue's case on a real engine: the EngineCore process inside a live worker is
    killed beside a healthy (fake-engine) worker of the same revision."""
    fleet = Fleet(make_log_opener("embedded", tmp_path))
    before = {p.pid for p in engine_processes()}
    try:
        engine = VllmEngine(tiny_engine_config(tiny_model_dir))
        # Paced: its generations are still running when the core dies.
        doomed = fleet.worker(engine, "vllm", serving=ThrottledEngine(engine, 0.05))
        healthy = fleet.worker(FakeEngine(hold=False), "healthy")
        served = fleet.serve(doomed)
        fleet.loop(healthy)
        wait_until(lambda: one_assignment_each(doomed, healthy), 60, what="the two workers to split the work topic")
        tenant = fleet.tenant()
        request_ids = fleet.request_ids(doomed._assigned, 3)  # noqa: SLF001 - work is keyed by request
        for request_id in request_ids:
            fleet.request(tenant, request_id, max_output_tokens=400)
        wait_until(lambda: len(starts_by(fleet, doomed.worker_id)) == 2 and doomed.queued == 1, 120,
                   what="two generations running on the real engine and one queued")
        running = starts_by(fleet, doomed.worker_id)
        [core] = [p for p in engine_processes() if p.pid not in before and p.name().startswith("VLLM::EngineCor")]
        core.kill()
        wait_until(lambda: all(settled(fleet, r) for r in running), SETTLED_WITHIN_S,
                   what="the running generations to fail and settle")
        for request_id in running:
            end = terminal_of(fleet, request_id)
            assert end.event_type == "GenerationFailed" and end.payload.error_code == "engine_dead", end
        served["thread"].join(60)
        assert served.get("exit_code") == EXIT_ENGINE_DEAD
        [waiting] = set(request_ids) - running
        end = wait_until(lambda: terminal_of(fleet, waiting), 60, what="the queued request to be served elsewhere")
        assert end.event_type == "GenerationCompleted"
        assert starts_by(fleet, healthy.worker_id) == {waiting}
        assert starts_by(fleet, doomed.worker_id) == running
    finally:
        fleet.close()
    assert not [p for p in engine_processes() if p.pid not in before], "vLLM processes outlived the engine"
