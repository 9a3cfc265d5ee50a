"""The engine watch on a real vLLM engine: its EngineCore process killed mid-stream, the
watch finds the engine dead within seconds and the stream in flight ends with `EngineDead`.
Starts an engine of its own (never the session's shared one), and reaps it."""
from __future__ import annotations

import time
import uuid

import pytest

from tests.engine_fixture import engine_processes, tiny_engine_config
from tests.engine_wrappers import PacedEngine
from tests.helpers import wait_until
from workers.engine import EngineDead, EngineRequest
from workers.engine_runner import EngineRunner
from workers.engine_watch import EngineWatch, WatchedEngine
from workers.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm

SEEN_WITHIN_S = 5.0


def test_a_killed_engine_core_is_found_dead_within_seconds_and_its_stream_ends(tiny_model_dir):
    before = {p.pid for p in engine_processes()}  # the session engine's, if started
    engine = VllmEngine(tiny_engine_config(tiny_model_dir))
    with EngineRunner(engine, name="doomed-engine") as runner:
        watch = EngineWatch(runner, engine, interval_s=1.0)
        # Paced: 400 tokens take 20 s, so the stream is in flight when the engine dies.
        watched = WatchedEngine(PacedEngine(engine, 0.05), watch, runner)
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
