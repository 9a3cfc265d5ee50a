"""KV figures through the engine port: a stand-in's known cache (whole blocks per running
request, back to zero when they end), vLLM's (its blocks × block size, its step usage over
the blocks requests can hold, the prefix-cache totals its stats add up), and a worker's
heartbeats carrying them. No vLLM engine starts: its adapter reads a stand-in AsyncLLM."""
from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from models.events_fleet import WorkerHeartbeat
from tests.fake_engine import FakeEngine
from tests.kv_stand_in import StandInKv
from tests.slow_engine import SlowEngine
from tests.unit.test_fleet_presence import FakeLog
from workers.engine import EngineRequest, KvFigures
from workers.engine_stats import EngineStats
from workers.vllm_engine import VllmEngine, VllmEngineConfig
from workers.fleet_presence import worker_presence


def request(request_id: str, prompt_words: int, max_output_tokens: int = 1) -> EngineRequest:
    return EngineRequest(request_id=request_id, prompt=" ".join(["w"] * prompt_words),
                         max_output_tokens=max_output_tokens, tenant_id="t")


def test_a_stand_in_cache_counts_whole_blocks_per_request_and_frees_them():
    kv = StandInKv(1024, block_size=16)
    kv.hold("a", 17)  # two blocks
    kv.hold("b", 16)  # one
    assert kv.figures() == KvFigures(capacity_tokens=1024, used_tokens=48, usage=48 / 1024)
    kv.grow("b")  # its 17th token takes a second block
    assert kv.figures().used_tokens == 64
    kv.release("a")
    kv.release("b")
    kv.release("never-held")
    assert (kv.figures().used_tokens, kv.figures().usage) == (0, 0.0)


def test_a_stand_in_without_a_cache_says_zeros_and_a_cache_is_whole_blocks():
    kv = StandInKv()
    kv.hold("a", 100)
    assert kv.figures() == KvFigures()
    with pytest.raises(ValueError, match="whole blocks"):
        StandInKv(1000, block_size=16)


def test_the_fake_engine_holds_its_prompt_until_the_held_request_ends():
    engine = FakeEngine(hold=True, kv_tokens=256, block_size=8)

    async def run():
        stream = engine.generate(request("r1", prompt_words=9))  # 9 tokens: two blocks of 8
        first = asyncio.ensure_future(anext(stream))
        deadline = asyncio.get_running_loop().time() + 5.0
        while "r1" not in engine._aborted:  # noqa: SLF001 - until the engine holds the request
            assert asyncio.get_running_loop().time() < deadline, "the held request never started"
            await asyncio.sleep(0)  # one turn of the loop, for the request's task to run
        during = engine.kv_figures()
        await engine.abort("r1")
        await first
        await stream.aclose()
        return during

    during = asyncio.run(run())
    assert (during.capacity_tokens, during.used_tokens, during.usage) == (256, 16, 16 / 256)
    assert engine.kv_figures().used_tokens == 0


def test_the_slow_engine_grows_by_each_token_made_and_frees_at_its_end():
    engine = SlowEngine(0.0, kv_tokens=64, block_size=4)
    seen: list[int] = []

    async def run():
        async for _ in engine.generate(request("r1", prompt_words=3, max_output_tokens=3)):
            seen.append(engine.kv_figures().used_tokens)

    asyncio.run(run())
    assert seen == [4, 8, 8]  # 3 prompt tokens and 1, 2, 3 made: 4, 5, 6 tokens in blocks of 4
    assert engine.kv_figures().used_tokens == 0


def test_stand_ins_keep_their_default_of_no_figures():
    assert FakeEngine(hold=False).kv_figures() == KvFigures() == SlowEngine().kv_figures()
    assert FakeEngine(hold=False).max_model_len() is None


def test_the_slow_engine_takes_its_cache_from_the_environment(monkeypatch):
    monkeypatch.setenv("LEDGERLM_TEST_KV_TOKENS", "2048")
    monkeypatch.setenv("LEDGERLM_TEST_KV_BLOCK", "32")
    engine = SlowEngine.from_settings(None)
    assert (engine.kv.capacity_tokens, engine.kv.block_size) == (2048, 32)


def _scheduler_step(usage: float, queries: int, hits: int):
    """What vLLM's scheduler hands its stat loggers, as far as `EngineStats` reads it."""
    return SimpleNamespace(kv_cache_usage=usage, num_running_reqs=1, num_waiting_reqs=0, num_skipped_waiting_reqs=0,
                           iteration_details=None, prefix_cache_stats=SimpleNamespace(queries=queries, hits=hits))


def test_engine_stats_add_up_prefix_cache_lookups_and_count_used_blocks():
    stats = EngineStats()
    stats.record(_scheduler_step(0.1, queries=32, hits=0), SimpleNamespace(num_preempted_reqs=1,
                                                                           num_generation_tokens=1))
    stats.record(_scheduler_step(0.5, queries=48, hits=32), None)
    # 11 blocks of 16: vLLM states usage over the 10 besides its null block, so half is 5.
    figures = stats.kv_figures(11, 16, busy=True)
    assert figures == KvFigures(capacity_tokens=176, used_tokens=80, usage=0.5, preemptions=1,
                                prefix_cache_queries=80, prefix_cache_hits=32, block_tokens=16, reserved_tokens=16)
    idle = stats.kv_figures(11, 16, busy=False)
    assert (idle.used_tokens, idle.usage, idle.prefix_cache_queries) == (0, 0.0, 80)


def _vllm_engine(*, log_stats: bool = True, unfinished: int = 1) -> VllmEngine:
    engine = VllmEngine(VllmEngineConfig(model=Path("/nonexistent"), max_model_len=512, log_stats=log_stats))
    engine._llm = SimpleNamespace(  # noqa: SLF001 - what start() leaves: AsyncLLM's config, as vLLM filled it in
        vllm_config=SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=101, block_size=16)),
        model_config=SimpleNamespace(max_model_len=384), get_num_unfinished_requests=lambda: unfinished)
    return engine


def test_vllm_capacity_is_its_blocks_times_their_size_and_use_is_of_the_last_step():
    engine = _vllm_engine()
    engine.stats.record(_scheduler_step(0.25, queries=64, hits=16), None)
    figures = engine.kv_figures()
    assert (figures.capacity_tokens, figures.used_tokens, figures.usage) == (1616, 400, 0.25)
    assert (figures.prefix_cache_queries, figures.prefix_cache_hits) == (64, 16)
    assert engine.max_model_len() == 384  # what vLLM settled on, not the configured 512


def test_vllm_says_nothing_before_it_starts_and_only_its_size_without_stats():
    before = VllmEngine(VllmEngineConfig(model=Path("/nonexistent"), max_model_len=512))
    assert before.kv_figures() == KvFigures() and before.max_model_len() == 512
    assert _vllm_engine(log_stats=False).kv_figures() == KvFigures(capacity_tokens=1616, block_tokens=16,
                                                                   reserved_tokens=16)


def test_an_idle_vllm_engine_holds_no_blocks_whatever_the_last_step_said():
    engine = _vllm_engine(unfinished=0)
    engine.stats.record(_scheduler_step(0.25, queries=0, hits=0), None)
    assert engine.kv_figures().used_tokens == 0


def test_a_workers_heartbeats_carry_its_engines_kv_figures():
    engine = FakeEngine(hold=True, kv_tokens=4096, block_size=16)
    worker = SimpleNamespace(worker_id="w1", pool="interactive", engine=engine, in_flight=2, queued=0, capacity=4,
                             output_tokens=0, _assigned=None)
    log = FakeLog()
    presence = worker_presence(worker, log, revision="rev-a", engine_config_hash="h", running=4, interval_s=3600)
    engine.kv.hold("r1", 20)  # two running requests: 2 blocks and 1
    engine.kv.hold("r2", 3)
    engine.kv.looked_up(40, 8)
    presence.start()
    presence.beat()
    engine.kv.release("r1")
    engine.kv.release("r2")
    presence.beat()
    presence.close()
    joined, busy, idle = (p for _, p in log.appended if p.event_type in ("WorkerJoined", "WorkerHeartbeat"))
    assert joined.capacity.kv_cache_tokens == 4096 and joined.capacity.max_model_len == 1
    assert isinstance(busy, WorkerHeartbeat)
    assert (busy.kv_tokens_used, busy.kv_cache_usage) == (48, 48 / 4096)
    assert (busy.prefix_cache_queries, busy.prefix_cache_hits, busy.preemptions) == (40, 8, 0)
    assert (idle.kv_tokens_used, idle.kv_cache_usage, idle.prefix_cache_queries) == (0, 0.0, 40)
