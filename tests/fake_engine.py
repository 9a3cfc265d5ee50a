"""A stand-in engine and work items written straight to the work topic, for testing the
pool worker's taking, fairness, deadlines and cancels without vLLM."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from models import topics
from models.events import decode, new_event
from models.events_generation import GenerationQueued, GenerationRequested, Position, PromptSubmitted
from pipelines.publish import publish
from tests.helpers import wait_until
from tests.kv_stand_in import StandInKv
from workers.engine import EngineDelta, InferenceEngine


class FakeEngine(InferenceEngine):
    """One token per request; with `hold`, never finishes until aborted or closed. With
    `kv_tokens`, a KV cache of that many tokens in blocks of `block_size`, which a running
    request holds its prompt (one token a word) and its output in (`tests.kv_stand_in`)."""

    def __init__(self, hold: bool, *, kv_tokens: int = 0, block_size: int = 16):
        self.hold, self.started = hold, []
        self._aborted: dict[str, asyncio.Event] = {}
        self.kv = StandInKv(kv_tokens, block_size)

    async def generate(self, request):
        self.started.append(request.request_id)
        self.kv.hold(request.request_id, self.count_tokens(request.prompt))
        try:
            if self.hold:
                self._aborted[request.request_id] = asyncio.Event()
                await self._aborted[request.request_id].wait()
                yield EngineDelta(request.request_id, "", 0, 0, True, "abort")
                return
            self.kv.grow(request.request_id)
            yield EngineDelta(request.request_id, "x", 1, 1, True, "length")
        finally:
            self.kv.release(request.request_id)

    def kv_figures(self):
        return self.kv.figures()

    async def abort(self, request_id):
        if request_id in self._aborted:
            self._aborted[request_id].set()

    async def health(self):
        return True

    def count_tokens(self, text):
        return len(text.split())

    def engine_config_hash(self):
        return "fake"

    def close(self):
        pass


def queue_work(log, tenant_id: str, request_id: str, *, deadline_s: float = 300.0, topic=topics.WORK_NORMAL) -> None:
    [prompt] = publish(log, topics.PROMPTS, [new_event(PromptSubmitted(request_id=request_id, prompt="p"),
                                                      tenant_id=tenant_id, correlation_id=request_id)])
    now = datetime.now(timezone.utc)
    req = GenerationRequested(request_id=request_id, model_alias="fake", model_revision="fake@1", input_tokens=1,
                              input_sha256="0" * 64, max_output_tokens=1, deadline_at=now + timedelta(seconds=deadline_s),
                              prompt_ref=Position(topic=prompt.topic, partition=prompt.partition, offset=prompt.offset))
    publish(log, topic, [new_event(GenerationQueued(request=req, reservation_id="res", queued_at=now),
                                                tenant_id=tenant_id, correlation_id=request_id)])


def started_ids(log) -> list[str]:
    return [env.payload.request_id for env in (decode(r.value) for r in log.read_topic(topics.OUTCOMES.name))
            if env.event_type == "GenerationStarted"]


def outcomes(log) -> dict[str, list]:
    """Outcome events by request id."""
    found: dict[str, list] = {}
    for record in log.read_topic(topics.OUTCOMES.name):
        env = decode(record.value)
        found.setdefault(env.correlation_id, []).append(env)
    return found


def run_until(worker, condition, what: str, timeout_s: float = 90):
    """Drives `worker` a round at a time until `condition` holds."""
    def step():
        worker.run_once(0.05)
        return condition()

    return wait_until(step, timeout_s, every_s=0, what=what)
