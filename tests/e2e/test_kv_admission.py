"""KV-aware admission end to end, on both logs: engines of known speed with a KV cache of
known size (`tests.slow_engine`) serve a revision of their own beside the shared tiny engine.
A request too long for every worker's KV cache is a 400 that gives the numbers; of two
workers, the one with twice the KV takes about twice the long prompts; admission's claims
pass the pool's KV while a burst waits and are back to 0 once it is served."""
from __future__ import annotations

import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from models import topics
from pipelines.admin import commands as admin
from pipelines.admission.capacity import key_of
from pipelines.admission.placement import kv_by_worker, owners_by_topic
from pipelines.generation.tokencount import TokenCounter
from tests.fleet_pool import assert_ended_and_settled_once, starts_by_worker, warm_up
from tests.helpers import wait_until
from tests.slow_engine import SlowEngine
from workers.engine_runner import EngineRunner

MAX_MODEL_LEN = 512
OUTPUT = 20


@contextmanager
def kv_revision(platform, kv_sizes: list[int], *, pause_s: float, max_in_flight: int = 8):
    """A revision of its own under a new alias, one worker per KV size in `kv_sizes` (tokens),
    each on its own engine of one token per `pause_s`: (alias, revision, loops)."""
    tag = uuid.uuid4().hex[:8]
    alias, revision = f"kv-{tag}", f"kv@{tag}"
    admin.approve_model(platform.view, alias=alias, model_revision=revision,
                        model_path=str(platform.runner.engine.config.model), engine_config_hash="slow-engine",
                        max_model_len=MAX_MODEL_LEN, actor="tests", price_input_per_1k_micros=1000,
                        price_output_per_1k_micros=2000)
    runners = [EngineRunner(SlowEngine(pause_s, kv_tokens=kv), name=f"kv-{kv}").start() for kv in kv_sizes]
    loops = [platform.start_worker(runner=runner, revision=revision, max_in_flight=max_in_flight)
             for runner in runners]
    try:
        yield alias, revision, loops
    finally:
        for loop in loops:
            loop.halt()
        for runner in runners:
            runner.close()


def tokens_of(platform, text: str) -> int:
    """The prompt tokens the API counts for `text` on these revisions (the tiny model's)."""
    return TokenCounter().count(str(platform.runner.engine.config.model), text)


def body(alias: str, prompt: str, **extra) -> dict:
    return {"model_alias": alias, "input": prompt, "ignore_eos": True, "stream": False, **extra}


def test_a_request_too_long_for_every_workers_kv_is_a_400_with_the_numbers(platform):
    _, secret = platform.tenant()
    prompt = "the " * 150
    prompt_tokens = tokens_of(platform, prompt)
    assert 100 < prompt_tokens < 256 - 20
    with kv_revision(platform, [256], pause_s=0.01) as (alias, revision, _), platform.client(secret) as client:
        wait_until(lambda: client.get(f"/v1/models/{alias}").json()["serving"]["workers"] >= 1, 30,
                   what="the fleet to show the worker")
        # 256 KV tokens, the context 512: the context alone would let this through.
        refused = client.post("/v1/generations", json=body(alias, prompt, max_output_tokens=200))
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens", error
        room = 256 - prompt_tokens
        for figure in (f"{prompt_tokens} input tokens + 200 output tokens", revision, "the largest holds 256 tokens",
                       "largest request that fits is 256 tokens", f"max_tokens {room} at most"):
            assert figure in error["message"], (figure, error["message"])
        too_long_prompt = client.post("/v1/generations", json=body(alias, "the " * 300, max_output_tokens=5))
        assert too_long_prompt.status_code == 400 and too_long_prompt.json()["error"]["param"] == "input"
        # What fits is served; a chat without max_tokens gets what the cache leaves.
        served = client.post("/v1/generations", json=body(alias, prompt, max_output_tokens=room))
        assert served.status_code == 200 and served.json()["type"] == "completed", served.text
        chat = client.post("/v1/chat/completions", json={"model": alias, "messages": [
            {"role": "user", "content": prompt}]})  # no max_tokens
        assert chat.status_code == 200, chat.text
        usage = chat.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == 256, usage


def test_the_worker_with_twice_the_kv_takes_about_twice_the_long_prompts(platform):
    _, secret = platform.tenant()
    prompts = [f"Document {i % 3}: " + "the " * 270 + f"question {i}" for i in range(30)]
    claim = max(tokens_of(platform, p) for p in prompts) + OUTPUT
    assert 250 < claim <= 340, claim  # 3 fit the small cache at once and 6 the large one
    with kv_revision(platform, [1024, 2048], pause_s=0.02) as (alias, revision, loops):
        small, large = (loop.worker.worker_id for loop in loops)
        normal = topics.work_topic(None, "normal", revision)
        warm_up(platform, secret, alias, revision, body(alias, "warm", max_output_tokens=OUTPUT), workers=2)

        def placement_knows_both() -> bool:  # owners and KV, from their heartbeats
            live = platform.admission.fleet.view.live()
            owners, _ = owners_by_topic(live)
            owned = owners.get(normal.name, {})
            return (sorted(owned) == list(range(normal.partitions)) and set(owned.values()) == {small, large}
                    and {small: 1024, large: 2048}.items() <= kv_by_worker(live).items())
        wait_until(placement_knows_both, 30, what="admission to know both workers' partitions and KV")
        key, capacity = key_of(None, revision), platform.admission.capacity
        assert capacity.kv_capacity(key) == 3072

        def send(prompt: str):
            with platform.client(secret) as own:
                return own.post("/v1/generations", json=body(alias, prompt, max_output_tokens=OUTPUT))
        with ThreadPoolExecutor(len(prompts)) as senders:
            pending = [senders.submit(send, p) for p in prompts]
            wait_until(lambda: capacity.claims(key) > 3072 or all(f.done() for f in pending), 60,
                       what="the burst's claims to pass the pool's KV")
            assert capacity.claims(key) > 3072, "the burst was admitted to wait, its claims held"
            answers = [f.result(timeout=120) for f in pending]
    assert all(a.status_code == 200 and a.json()["type"] == "completed" for a in answers), \
        [a.text for a in answers if a.status_code != 200][:3]
    ids = {a.json()["id"] for a in answers}
    share = Counter(starts_by_worker(platform, ids).values())
    assert sum(share.values()) == len(prompts)
    assert 1.5 <= share[large] / max(1, share[small]) <= 3.0, share
    assert_ended_and_settled_once(platform, ids)
    wait_until(lambda: capacity.claims(key) == 0, 30, what="admission's claims to go back to 0")
    assert capacity.kv_claims.on_worker(small) == capacity.kv_claims.on_worker(large) == 0
