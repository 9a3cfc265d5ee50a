"""A pool worker dies mid-stream: the request still ends (expired at deadline + grace), its
reservation settles exactly once, work it had queued but not started goes to the next
worker, and a restarted worker serves new work."""
from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from models import topics
from models.events import decode, new_event
from models.events_generation import GenerationCompleted, Timings
from pipelines import admin
from pipelines.eventlog import EventLog, EventLogError
from pipelines.routing import publish
from tests.engine_wrappers import PacedEngine
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until


class SeverableLog:
    """A worker's log handle that can be cut, as the log looks from a process that died."""

    def __init__(self, inner: EventLog):
        self._inner, self.severed = inner, False

    def __getattr__(self, name):
        if self.severed and name in ("append", "read", "end_offset", "tail", "consumer"):
            raise EventLogError("this worker is gone")
        return getattr(self._inner, name)


def events_of(log, topic, request_id: str) -> list:
    return [env for env in (decode(r.value) for r in log.read_topic(topic.name)) if env.correlation_id == request_id]


def sse(response):
    for line in response.iter_lines():
        if line.startswith("data: ") and line[6:] != "[DONE]":
            yield json.loads(line[6:])


@pytest.mark.timing
def test_a_worker_killed_mid_stream_ends_the_request_and_settles_once(platform):
    grace_s = platform.settings.grace_s
    tenant_id, secret = platform.tenant()
    pool = "crash-" + uuid.uuid4().hex[:8]
    admin.set_limits(platform.view, tenant_id=tenant_id, actor="tests", pool=pool)
    worker_log = SeverableLog(platform.open_log())
    platform.logs.append(worker_log._inner)
    # Paced: 400 tokens take 20 s, past the deadline, so the crash always comes mid-stream.
    doomed = platform.start_worker(pool=pool, max_in_flight=1, log=worker_log, close=lambda: None,
                                   engine=PacedEngine(platform.runner.engine, 0.05))

    deadline_ms = 8000
    long = {"model_alias": MODEL_ALIAS, "input": "tell a long story", "max_output_tokens": 400, "ignore_eos": True,
            "deadline_ms": deadline_ms}
    queued = {"model_alias": MODEL_ALIAS, "input": "wait your turn", "max_output_tokens": 3, "ignore_eos": True,
              "stream": False}
    with platform.client(secret) as client, client.stream("POST", "/v1/generations", json=long) as response:
        started_at = time.monotonic()
        assert response.status_code == 200
        frames = sse(response)
        first = next(frames)
        request_id = first["request_id"]
        while first["type"] != "tokens":
            first = next(frames)
        # A second request, queued behind the first on the busy worker (one slot).
        def post_queued():
            with platform.client(secret) as other:
                return other.post("/v1/generations", json=queued)

        pending = ThreadPoolExecutor(1).submit(post_queued)
        wait_until(lambda: doomed.worker.queued == 1, 30, what="the second request to be queued on the worker")

        # The crash: the loop stops, the process's log and engine requests vanish with it.
        doomed.stop.set()
        doomed.thread.join(10)
        worker_log.severed = True
        platform.runner.submit(platform.runner.engine.abort(request_id), timeout=10)
        doomed.worker._consumer.close()
        doomed.worker._cancels.stop()

        rest = list(frames)
        ended_after_s = time.monotonic() - started_at
    final = rest[-1]
    assert final["type"] == "failed" and final["error"]["code"] == "expired", final
    assert ended_after_s <= deadline_ms / 1000 + grace_s + 10

    ledger = events_of(platform.admin_log, topics.LEDGER, request_id)
    kinds = [e.event_type for e in ledger]
    assert kinds == ["BudgetReserved", "GenerationAdmitted", "ReservationExpired", "UsageSettled",
                     "ReservationReleased"], kinds
    assert ledger[3].payload.terminal_status == "expired"
    assert ledger[4].payload.released_tokens == ledger[0].payload.tokens

    # The worker wakes up after all and reports: nothing settles twice.
    late = new_event(GenerationCompleted(request_id=request_id, finish_reason="length", input_tokens=5,
                                         output_tokens=400, model_revision=platform.model_revision,
                                         output_sha256="0" * 64, timings=Timings()),
                     tenant_id=tenant_id, correlation_id=request_id)
    publish(platform.admin_log, topics.OUTCOMES, [late])
    marker = platform.tenant()  # a later request through admission proves it has read past the late event
    with platform.client(marker[1]) as client:
        assert client.post("/v1/generations", json={**queued, "input": "after"}).status_code == 200
    assert [e.event_type for e in events_of(platform.admin_log, topics.LEDGER, request_id)].count("UsageSettled") == 1

    # A restarted worker takes over the pool: the queued request, then new work.
    platform.start_worker(pool=pool, max_in_flight=2)
    waited = pending.result(timeout=120)
    assert waited.status_code == 200 and waited.json()["type"] == "completed", waited.text
    with platform.client(secret) as client:
        again = client.post("/v1/generations", json={**queued, "input": "fresh work"})
    assert again.status_code == 200 and again.json()["usage"]["output_tokens"] == 3
    started = [e for e in events_of(platform.admin_log, topics.OUTCOMES, request_id) if e.event_type == "GenerationStarted"]
    assert len(started) == 1, "the request that was running is not run again"
    platform.check()
