"""A pool worker dies mid-stream: within seconds admission declares it lost (its heartbeats
stopped) and the request ends as `worker_lost`, its client's stream with it; its reservation
settles exactly once and its tenant's slot is free again; work it had queued but not
started goes to the next worker, a late report from the dead worker settles nothing, and a
restarted worker serves new work. Both logs, with admission a process of its own and
beside the shared worker (`serve worker --admit`)."""
from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from models import topics
from models.events import decode, new_event
from models.events_generation import GenerationCompleted, Timings
from pipelines.admin import commands as admin
from pipelines.eventlog import EventLog, EventLogError
from pipelines.publish import publish
from tests.conftest import platform_both_ways
from tests.engine_wrappers import ThrottledEngine
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until

platform = platform_both_ways()
# How long after the crash the client may wait for the end: the lost bound, the fleet read
# and check (0.25 s each), the settlement's linger, and slack for a loaded machine.
SLACK_S = 5.0


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
def test_a_worker_killed_mid_stream_is_lost_in_seconds_and_settles_once(platform):
    lost_after_s = platform.settings.worker_lost_after_s
    tenant_id, secret = platform.tenant()
    pool = "crash-" + uuid.uuid4().hex[:8]
    admin.set_limits(platform.view, tenant_id=tenant_id, actor="tests", pool=pool, max_concurrent=2)
    worker_log = SeverableLog(platform.open_log())  # the crashed process's: closed when the test ends
    loops = []
    try:
        # Paced: 400 tokens take 20 s, so the crash always comes mid-stream.
        doomed = platform.start_worker(pool=pool, max_in_flight=1, log=worker_log, close=lambda: None,
                                       engine=ThrottledEngine(platform.runner.engine, 0.05))
        loops.append(doomed)

        long = {"model_alias": MODEL_ALIAS, "input": "tell a long story", "max_output_tokens": 400, "ignore_eos": True}
        queued = {"model_alias": MODEL_ALIAS, "input": "wait your turn", "max_output_tokens": 3, "ignore_eos": True,
                  "stream": False}
        with platform.client(secret) as client, client.stream("POST", "/v1/generations", json=long) as response:
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
            with platform.client(secret) as other:  # both of the tenant's slots are held
                assert other.post("/v1/generations", json={**queued, "input": "a third"}).status_code == 429

            # The crash: the loop stops (and with it the heartbeats), the process's log and engine
            # requests vanish with it.
            doomed.stop.set()
            doomed.thread.join(10)
            crashed_at = time.monotonic()
            worker_log.severed = True
            platform.runner.submit(platform.runner.engine.abort(request_id), timeout=10)
            doomed.worker._consumer.close()
            doomed.worker._cancels.stop()

            rest = list(frames)
            ended_after_s = time.monotonic() - crashed_at
        final = rest[-1]
        assert final["type"] == "failed" and final["error"]["code"] == "worker_lost", final
        assert ended_after_s <= lost_after_s + SLACK_S, f"the stream ended {ended_after_s:.1f} s after the crash"

        ledger = events_of(platform.admin_log, topics.LEDGER, request_id)
        kinds = [e.event_type for e in ledger]
        assert kinds == ["BudgetReserved", "GenerationAdmitted", "UsageSettled", "ReservationReleased"], kinds
        assert (ledger[2].payload.terminal_status, ledger[2].payload.output_tokens) == ("failed", 0)
        assert ledger[3].payload.released_tokens == ledger[0].payload.tokens

        # Its slot is free again: a new request of the tenant is admitted (the queued one holds the
        # other) and, sent to the shared pool (this one has no live worker now), served.
        admin.set_limits(platform.view, tenant_id=tenant_id, actor="tests", pool=None)
        with platform.client(secret) as client:
            fresh = wait_until(lambda: (r := client.post("/v1/generations", json=queued)).status_code != 503 and r, 30,
                               what="the API to route the tenant to the shared pool")
        assert fresh.status_code == 200 and fresh.json()["type"] == "completed", fresh.text
        admin.set_limits(platform.view, tenant_id=tenant_id, actor="tests", pool=pool)

        # The worker wakes up after all and reports; the queued request, of the same tenant (one
        # outcomes partition, read in order), ends after it: once it settles, the late end was read.
        late = new_event(GenerationCompleted(request_id=request_id, finish_reason="length", input_tokens=5,
                                             output_tokens=400, model_revision=platform.model_revision,
                                             output_sha256="0" * 64, timings=Timings()),
                         tenant_id=tenant_id, correlation_id=request_id)
        publish(platform.admin_log, topics.OUTCOMES, [late])

        # A restarted worker takes over the pool: the queued request, then new work.
        loops.append(platform.start_worker(pool=pool, max_in_flight=2))
        waited = pending.result(timeout=120)
        assert waited.status_code == 200 and waited.json()["type"] == "completed", waited.text
        wait_until(lambda: "UsageSettled" in [e.event_type for e in events_of(platform.admin_log, topics.LEDGER,
                                                                              waited.json()["id"])], 30,
                   what="the queued request to settle")
        assert [e.event_type for e in events_of(platform.admin_log, topics.LEDGER, request_id)].count("UsageSettled") == 1
        with platform.client(secret) as client:
            again = wait_until(lambda: (r := client.post("/v1/generations", json={**queued, "input": "fresh work"}))
                               .status_code != 503 and r, 30, what="the API to see the restarted worker")
        assert again.status_code == 200 and again.json()["usage"]["output_tokens"] == 3
        started = [e for e in events_of(platform.admin_log, topics.OUTCOMES, request_id) if e.event_type == "GenerationStarted"]
        assert len(started) == 1, "the request that was running is not run again"
        platform.check()
    finally:
        for loop in loops:
            loop.halt()
        worker_log._inner.close()
