"""A pool worker does not overfill its engine's KV cache: with slots to spare it starts only
what fits the cache beside what runs (prompt plus max output tokens each), starts the next
as one ends, runs a request bigger than the whole cache alone once idle, and lets nothing
smaller overtake the request it holds back. A holding fake engine with a KV cache of known
size stands in for vLLM; both logs."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from models import topics
from models.events import new_event
from models.events_generation import GenerationQueued, GenerationRequested, Position, PromptSubmitted
from pipelines.publish import publish
from tests.conftest import make_log_opener
from tests.fake_engine import FakeEngine, run_until
from workers.engine_runner import EngineRunner
from workers.interactive import InteractiveWorker

KV_TOKENS = 1024


@pytest.fixture(params=["embedded", "kafka"])
def gated(request, tmp_path):
    """A worker of eight slots on a holding engine of `KV_TOKENS`: (log, engine, worker)."""
    open_log = make_log_opener(request.param, tmp_path)
    runner = EngineRunner(FakeEngine(hold=True, kv_tokens=KV_TOKENS)).start()
    log = open_log()
    worker = InteractiveWorker(log, runner, runner.engine, max_in_flight=8, worker_id=f"w-{uuid.uuid4().hex[:6]}")
    yield log, runner, worker
    for request_id in list(runner.engine.started):
        runner.submit(runner.engine.abort(request_id), timeout=10)
    worker._cancels.stop()  # noqa: SLF001
    worker._consumer.close()  # noqa: SLF001
    runner.close()
    log.close()


def queue(log, request_id: str, *, input_tokens: int, max_output_tokens: int) -> None:
    [prompt] = publish(log, topics.PROMPTS, [new_event(PromptSubmitted(request_id=request_id, prompt="p"),
                                                      tenant_id="acme", correlation_id=request_id)])
    now = datetime.now(timezone.utc)
    req = GenerationRequested(request_id=request_id, model_alias="fake", model_revision="fake@1",
                              input_tokens=input_tokens, input_sha256="0" * 64, max_output_tokens=max_output_tokens,
                              deadline_at=now + timedelta(seconds=300),
                              prompt_ref=Position(topic=prompt.topic, partition=prompt.partition, offset=prompt.offset))
    publish(log, topics.WORK_NORMAL, [new_event(GenerationQueued(request=req, reservation_id="res", queued_at=now),
                                                tenant_id="acme", correlation_id=request_id)])


def finish(runner, request_id: str) -> None:
    runner.submit(runner.engine.abort(request_id), timeout=10)


def test_the_worker_starts_only_what_fits_its_engines_kv(gated):
    log, runner, worker = gated
    engine = runner.engine
    for i in range(4):
        queue(log, f"r{i}", input_tokens=200, max_output_tokens=200)  # 400 each: two fit 1024
    run_until(worker, lambda: len(engine.started) == 2 and worker.queued == 2, "two to start, two to wait")
    for _ in range(5):  # slots to spare, no KV: nothing more starts
        worker.run_once(0.05)
    assert len(engine.started) == 2 and worker.in_flight == 2
    finish(runner, engine.started[0])
    run_until(worker, lambda: len(engine.started) == 3, "the next to start as one ends")
    assert worker.queued == 1


def test_a_request_bigger_than_the_cache_runs_alone_and_is_not_overtaken(gated):
    log, runner, worker = gated
    engine = runner.engine
    queue(log, "running", input_tokens=100, max_output_tokens=100)
    run_until(worker, lambda: engine.started == ["running"], "the first to start")
    queue(log, "huge", input_tokens=1000, max_output_tokens=500)  # more than the whole cache
    queue(log, "small", input_tokens=10, max_output_tokens=10)
    for _ in range(5):
        worker.run_once(0.05)
    assert engine.started == ["running"], "nothing smaller overtakes what is held back"
    finish(runner, "running")
    run_until(worker, lambda: engine.started[-1] == "huge", "the huge one to start once the worker is idle")
    for _ in range(5):
        worker.run_once(0.05)
    assert engine.started == ["running", "huge"], "it runs alone"
    finish(runner, "huge")
    run_until(worker, lambda: engine.started[-1] == "small", "the small one to start after it")
