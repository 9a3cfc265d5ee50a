"""SmolLM2-135M-Instruct, prepared from its PyPI package, loads in the platform's own vLLM
adapter and writes real text: a greedy summary of a news paragraph names what the
paragraph named, which the tiny random model cannot do. The engine is this test's own,
started and shut down inside it (vLLM spawns processes)."""
from __future__ import annotations

import json
import time
import uuid


from models.settings import Settings
from pipelines.generation.tokencount import TokenCounter
from tests.engine_fixture import ENGINE_START_TIMEOUT_S, engine_processes
from workers.engine import EngineRequest
from workers.engine_runner import EngineRunner
from workers.vllm_engine import VllmEngine

pytest_plugins = ["tests.small_model_fixture"]

# Names a model writes only if it read the paragraph.
NEWS = ("Maria Lopez, the mayor of Portland, opened a new public library on Monday. "
        "The three-story building holds 200,000 books and a rooftop garden.")
NEWS_NAMES = ("Portland", "Lopez")
MAX_OUTPUT_TOKENS = 40  # about 3 s at the ~13 tokens/s one stream gets on these CPUs
DELTA_TIMEOUT_S = 60.0


def test_prepared_directory_is_a_plain_unquantized_checkpoint(small_model_dir):
    config = json.loads((small_model_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    prompt = TokenCounter().chat_prompt(str(small_model_dir), [{"role": "user", "content": "Hi"}])
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_smollm2_summary_names_what_the_news_named(small_model_dir):
    settings = Settings(model=small_model_dir, max_model_len=1024, kv_cache_gb=0.25, engine_max_seqs=4)
    prompt = TokenCounter().chat_prompt(str(small_model_dir), [
        {"role": "user", "content": f"Summarize this news in one sentence.\n\n{NEWS}"}])
    request = EngineRequest(request_id=f"req-{uuid.uuid4().hex[:12]}", prompt=prompt, tenant_id="tenant-a",
                            max_output_tokens=MAX_OUTPUT_TOKENS, temperature=0.0)
    # Other engines of the session (the shared tiny one) may be running: only this one's count.
    before = {p.pid for p in engine_processes()}
    runner = EngineRunner(VllmEngine.from_settings(settings), name="smollm2-engine")
    try:
        runner.start(timeout=ENGINE_START_TIMEOUT_S)
        began = time.monotonic()
        deltas = list(runner.stream(request, timeout=DELTA_TIMEOUT_S))
        seconds = time.monotonic() - began
        start_s = runner.engine.start_seconds
    finally:
        runner.close()
    left = [p for p in engine_processes() if p.pid not in before]
    assert not left, f"vLLM processes outlived the engine: {left}"
    summary = "".join(d.text for d in deltas)
    tokens = deltas[-1].output_tokens
    print(f"\nengine start {start_s:.1f} s; {tokens} tokens in {seconds:.1f} s "
          f"({tokens / seconds:.1f}/s); summary: {summary!r}")
    assert deltas[-1].finished and 0 < tokens <= MAX_OUTPUT_TOKENS
    assert any(name in summary for name in NEWS_NAMES), summary
