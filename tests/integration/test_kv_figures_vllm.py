"""The KV figures a worker heartbeats, against real vLLM engines (CPU build): the capacity
is what vLLM allocated for its KV budget, and the capacity plan's bytes-per-token
arithmetic (`models.capacity_plan`) finds the same number of tokens for the same budget,
within one block's rounding, for the tiny model (the session's shared engine) and
SmolLM2 (an engine of its own: no shared one exists). Under load the engine holds whole
blocks, a heartbeat says so, and it holds none once the generation ends; prompt tokens
looked up in and found in the prefix cache add up."""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from types import SimpleNamespace


from models.capacity_inputs import model_shape_from_config
from models.capacity_plan import kv_plan
from models.events_fleet import WorkerHeartbeat
from models.settings import Settings
from tests.engine_fixture import ENGINE_START_TIMEOUT_S, engine_processes
from tests.helpers import wait_until
from tests.unit.test_fleet_presence import FakeLog
from workers.engine import EngineRequest
from workers.engine_runner import EngineRunner
from workers.vllm_engine import GiB, VllmEngine
from workers.fleet_presence import engine_capacity_of, worker_presence

pytest_plugins = ["tests.small_model_fixture"]

DELTA_TIMEOUT_S = 60.0
# Longer than two KV blocks (128 tokens each on CPU) of the tiny model's tokenizer.
LONG_TEXT = ("The ledger is the oldest database. A merchant wrote down every sale, every loan and "
             "every debt in a book that nobody was allowed to erase. ") * 12


def request(prompt: str, **fields) -> EngineRequest:
    return EngineRequest(request_id=f"req-{uuid.uuid4().hex[:12]}", prompt=prompt, tenant_id="tenant-kv", **fields)


def assert_plan_matches_allocation(engine: VllmEngine) -> None:
    """vLLM's KV tokens (its blocks × block size) against the plan's for the same budget."""
    cache = engine._llm.vllm_config.cache_config  # noqa: SLF001 - what vLLM allocated
    budget = int(engine.config.kv_cache_gb * GiB)
    assert cache.kv_cache_memory_bytes == budget, "vLLM sized its KV cache from another budget"
    block = cache.block_size
    allocated = engine.kv_figures().capacity_tokens
    assert allocated == cache.num_gpu_blocks * block > 0
    config = json.loads((Path(engine.config.model) / "config.json").read_text())
    shape = model_shape_from_config(config, dtype=engine.config.dtype)  # the KV cache is in the engine's dtype
    plan = kv_plan(shape, context_tokens=engine.max_model_len(), kv_budget_gb=budget / GiB)
    # vLLM hands out whole blocks: the plan's tokens, rounded down to one.
    assert 0 <= plan.kv_tokens - allocated < block, (plan.kv_tokens, allocated, block)
    assert engine_capacity_of(engine, running=4).kv_cache_tokens == allocated


def test_the_tiny_models_plan_matches_what_vllm_allocated(vllm_engine):
    assert_plan_matches_allocation(vllm_engine)
    assert vllm_engine.max_model_len() == 512


def test_smollm2s_plan_matches_what_vllm_allocated(small_model_dir):
    settings = Settings(model=small_model_dir, max_model_len=1024, kv_cache_gb=0.125, engine_max_seqs=4)
    before = {p.pid for p in engine_processes()}  # the session's shared engine may be running
    runner = EngineRunner(VllmEngine.from_settings(settings), name="smollm2-kv-engine")
    try:
        runner.start(timeout=ENGINE_START_TIMEOUT_S)
        assert_plan_matches_allocation(runner.engine)
    finally:
        runner.close()
    assert not [p for p in engine_processes() if p.pid not in before], "vLLM processes outlived the engine"


def test_a_running_generation_holds_whole_blocks_a_heartbeat_reports_and_frees_them(engine_runner, vllm_engine):
    block = vllm_engine._llm.vllm_config.cache_config.block_size  # noqa: SLF001
    worker = SimpleNamespace(worker_id="kv-worker", pool="interactive", engine=vllm_engine, in_flight=1, queued=0,
                             capacity=1, output_tokens=0, _assigned=None)
    log = FakeLog()
    presence = worker_presence(worker, log, revision="rev-kv", engine_config_hash="h", running=1, interval_s=3600)
    presence.start()
    req = request(f"{uuid.uuid4()} {LONG_TEXT}", max_output_tokens=48, ignore_eos=True)
    held: list[int] = []
    try:
        for delta in engine_runner.stream(req, timeout=DELTA_TIMEOUT_S):
            if not delta.finished:
                held.append(vllm_engine.kv_figures().used_tokens)
                presence.beat()
        prompt_tokens = delta.prompt_tokens
        wait_until(lambda: vllm_engine.kv_figures().used_tokens == 0, 10, what="the engine to free its blocks")
        presence.beat()
    finally:
        presence.close()
    most = -(-(prompt_tokens + req.max_output_tokens) // block) * block
    assert held and all(used % block == 0 and prompt_tokens <= used <= most for used in held), (held, most)
    beats = [p for _, p in log.appended if isinstance(p, WorkerHeartbeat)]
    assert any(b.kv_tokens_used >= prompt_tokens and b.kv_cache_usage > 0 for b in beats[:-1])
    assert (beats[-1].kv_tokens_used, beats[-1].kv_cache_usage) == (0, 0.0)
    assert beats[-1].capacity.kv_cache_tokens == vllm_engine.kv_figures().capacity_tokens


def test_prefix_cache_lookups_and_hits_add_up(engine_runner, vllm_engine):
    block = vllm_engine._llm.vllm_config.cache_config.block_size  # noqa: SLF001
    prompt = f"{uuid.uuid4()} {LONG_TEXT}"
    before = vllm_engine.kv_figures()
    first = list(engine_runner.stream(request(prompt, max_output_tokens=2), timeout=DELTA_TIMEOUT_S))
    again = list(engine_runner.stream(request(prompt, max_output_tokens=2), timeout=DELTA_TIMEOUT_S))
    after = vllm_engine.kv_figures()
    prompt_tokens = first[-1].prompt_tokens
    assert after.prefix_cache_queries - before.prefix_cache_queries == 2 * prompt_tokens
    # The second finds the first's full blocks, as its own count of cached tokens says.
    assert after.prefix_cache_hits - before.prefix_cache_hits == again[-1].cached_prompt_tokens >= block
