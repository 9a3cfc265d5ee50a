"""Fair share reads ahead and takes work out of order; a worker that dies then must leave
every untaken item to its successor and no taken one. A fake engine holds the first
worker's generations open, so the crash finds work taken past its commit point. Runs on
both event logs."""
from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from models import topics
from models.events import decode, new_event
from models.events_generation import GenerationQueued, GenerationRequested, Position, PromptSubmitted
from pipelines.eventlog import partition_for
from pipelines.routing import publish
from tests.conftest import make_log_opener
from tests.harness import wait_until
from workers.engine import EngineDelta, InferenceEngine
from workers.engine_runner import EngineRunner
from workers.interactive import InteractiveWorker


class FakeEngine(InferenceEngine):
    """One token per request; with `hold`, never finishes until aborted or closed."""

    def __init__(self, hold: bool):
        self.hold, self.started = hold, []
        self._aborted: dict[str, asyncio.Event] = {}

    async def generate(self, request):
        self.started.append(request.request_id)
        if self.hold:
            self._aborted[request.request_id] = asyncio.Event()
            await self._aborted[request.request_id].wait()
            yield EngineDelta(request.request_id, "", 0, 0, True, "abort")
            return
        yield EngineDelta(request.request_id, "x", 1, 1, True, "length")

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


def queue_work(log, tenant_id: str, request_id: str) -> None:
    [prompt] = publish(log, topics.PROMPTS, [new_event(PromptSubmitted(request_id=request_id, prompt="p"),
                                                      tenant_id=tenant_id, correlation_id=request_id)])
    now = datetime.now(timezone.utc)
    req = GenerationRequested(request_id=request_id, model_alias="fake", model_revision="fake@1", input_tokens=1,
                              input_sha256="0" * 64, max_output_tokens=1, deadline_at=now + timedelta(minutes=5),
                              prompt_ref=Position(topic=prompt.topic, partition=prompt.partition, offset=prompt.offset))
    publish(log, topics.WORK_NORMAL, [new_event(GenerationQueued(request=req, reservation_id="res", queued_at=now),
                                                tenant_id=tenant_id, correlation_id=request_id)])


def started_ids(log) -> list[str]:
    ids = []
    for partition in range(log.partitions(topics.OUTCOMES.name)):
        for record in log.read(topics.OUTCOMES.name, partition, 0, max_records=1000):
            env = decode(record.value)
            if env.event_type == "GenerationStarted":
                ids.append(env.payload.request_id)
    return ids


def run_until(worker, condition, what: str):
    def step():
        worker.run_once(0.05)
        return condition()

    wait_until(step, 90, interval_s=0, what=what)


@pytest.mark.parametrize("kind", ["embedded", "kafka"])
def test_work_taken_out_of_order_is_neither_lost_nor_run_twice_after_a_crash(kind, tmp_path):
    open_log = make_log_opener(kind, tmp_path)
    log = open_log()
    heavy, light = "t0", "t2"  # two tenants whose work shares one partition
    assert partition_for(heavy, 4) == partition_for(light, 4)
    run = uuid.uuid4().hex[:6]
    order = [f"{heavy}-{run}-{i}" for i in range(4)] + [f"{light}-{run}-0"]
    for request_id in order:
        queue_work(log, request_id.split("-")[0], request_id)

    holding = EngineRunner(FakeEngine(hold=True)).start()
    first = InteractiveWorker(open_log(), holding, holding.engine, max_in_flight=2, worker_id=f"first-{run}")
    try:
        # Fair share takes the heavy tenant's first item and then the light tenant's, which is
        # last in the partition: the commit point stays at the heavy tenant's second item.
        run_until(first, lambda: len(holding.engine.started) == 2, "the first worker to start two")
        assert sorted(holding.engine.started) == sorted([order[0], order[4]])
    finally:
        first._consumer.close()  # dies: no terminal events, no further commits
        holding.close()

    finishing = EngineRunner(FakeEngine(hold=False)).start()
    second = InteractiveWorker(open_log(), finishing, finishing.engine, max_in_flight=8, worker_id=f"second-{run}")
    try:
        run_until(second, lambda: len(finishing.engine.started) >= 3 and second.in_flight == 0,
                  "the second worker to take the rest")
        for _ in range(20):  # a few more rounds: anything redelivered would start now
            second.run_once(0.05)
        assert sorted(finishing.engine.started) == sorted(order[1:4])
        assert sorted(started_ids(log)) == sorted(order)
    finally:
        second.close()
        finishing.close()
        log.close()
