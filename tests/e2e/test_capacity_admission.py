"""Capacity-aware admission end to end, on both logs: a slow fake engine (known speed)
serves a revision of its own beside the shared tiny engine. A deadline the queue ahead
makes impossible is refused before it queues; with the queue at its bound, normal priority
is shed (503, `Retry-After`) while high is still admitted and served; every admitted
request ends and settles exactly once, and nothing hangs."""
from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from models import topics
from pipelines.admin import commands as admin
from pipelines.admission.capacity import QueueBound
from tests import fleet_pool
from tests.fleet_pool import assert_settled_once, ledger_kinds, of_tenant
from tests.helpers import wait_until
from tests.slow_engine import SlowEngine
from workers.engine_runner import EngineRunner

PAUSE_S = 0.1  # a token; 20 tokens: 2 s a request
TOKENS = 20
# High priority's queue time (from queued to started) with the queue at its bound, stated
# and asserted: taken before normal work, it waits for a slot to free, within a request's
# service (2 s; the third of three waits for a second one); the rest is slack for a loaded machine.
HIGH_QUEUE_BOUND_MS = 6000


@pytest.fixture
def slow_revision(platform):
    """A revision served by one worker (2 slots) on a slow fake engine: (alias, revision, loop)."""
    tag = uuid.uuid4().hex[:8]
    alias, revision = f"slow-{tag}", f"slow@{tag}"
    admin.approve_model(platform.view, alias=alias, model_revision=revision,
                        model_path=str(platform.runner.engine.config.model), engine_config_hash="slow-engine",
                        max_model_len=512, actor="tests", price_input_per_1k_micros=1000,
                        price_output_per_1k_micros=2000)
    runner = EngineRunner(SlowEngine(PAUSE_S), name="slow-engine").start()
    loop = platform.start_worker(runner=runner, revision=revision, max_in_flight=2)
    bound = platform.admission.capacity.bound
    try:
        yield alias, revision, loop
    finally:
        platform.admission.capacity.bound = bound
        loop.halt()
        runner.close()


def body(alias: str, request_id: str, **extra) -> dict:
    return {"model_alias": alias, "input": "slow", "max_output_tokens": TOKENS, "ignore_eos": True,
            "stream": False, "request_id": request_id, **extra}


def post(platform, secret: str, payload: dict):
    with platform.client(secret, timeout_s=60) as client:
        return client.post("/v1/generations", json=payload)


def warm_up(platform, secret: str, alias: str, revision: str) -> None:
    """One request served, so admission has measured the revision's pace."""
    fleet_pool.warm_up(platform, secret, alias, revision, body(alias, f"warm-{uuid.uuid4().hex[:8]}"))


def test_a_deadline_the_queue_ahead_makes_impossible_is_refused_before_it_queues(platform, slow_revision):
    alias, revision, _ = slow_revision
    tenant_id, secret = platform.tenant()
    warm_up(platform, secret, alias, revision)
    # Alone it fits: one request takes about 2 s, and the deadline leaves 8 s (room for a
    # first measurement that caught a slow start: the pace is measured from one request).
    with platform.client(secret) as client:
        alone = client.post("/v1/generations", json=body(alias, f"alone-{uuid.uuid4().hex[:8]}", deadline_ms=8000))
        assert alone.status_code == 200, alone.text
    # Two running and eight queued ahead, one a second: the next would start in about 8 s.
    ahead = [f"ahead-{i}-{uuid.uuid4().hex[:6]}" for i in range(10)]
    with ThreadPoolExecutor(len(ahead)) as pool:
        pending = [pool.submit(post, platform, secret, body(alias, r)) for r in ahead]
        # (the warm-up and the one alone were admitted before them)
        wait_until(lambda: sum("BudgetReserved" in k for k in ledger_kinds(platform, tenant_id).values())
                   == len(ahead) + 2, 30, what="the queue ahead to be admitted")
        refused = post(platform, secret, body(alias, "late", deadline_ms=4000))
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "deadline" and "queued ahead" in error["message"], error
        assert int(refused.headers["Retry-After"]) >= 1
        responses = [f.result(timeout=90) for f in pending]  # nothing hangs
    assert [r.status_code for r in responses] == [200] * len(ahead), [r.text for r in responses]
    ahead = [r.json()["id"] for r in responses]
    # Refused before it queued: rejected on the ledger, never on a work topic.
    [late] = [r for r, k in ledger_kinds(platform, tenant_id).items() if k == ["GenerationRejected"]]
    for priority in ("normal", "high"):
        work = topics.work_topic(None, priority, revision).name
        assert late not in {env.correlation_id for env in of_tenant(platform, work, tenant_id)}
    assert_settled_once(platform, tenant_id, ahead)


def test_with_the_queue_at_its_bound_normal_is_shed_and_high_still_served(platform, slow_revision):
    alias, revision, _ = slow_revision
    tenant_id, secret = platform.tenant(may_send_high=True)
    warm_up(platform, secret, alias, revision)
    # Two slots: normal work queues up to 4, high up to 8.
    platform.admission.capacity.bound = QueueBound(per_slot=2, floor=0)
    normal = [f"normal-{i}-{uuid.uuid4().hex[:6]}" for i in range(12)]
    high = [f"high-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    with ThreadPoolExecutor(len(normal) + len(high)) as pool:
        pending = {r: pool.submit(post, platform, secret, body(alias, r)) for r in normal}
        first_shed = wait_until(lambda: next((f.result() for f in pending.values()
                                              if f.done() and f.result().status_code == 503), None), 60,
                                what="normal work to be shed")
        pending.update({r: pool.submit(post, platform, secret, body(alias, r, priority="high")) for r in high})
        responses = {r: f.result(timeout=90) for r, f in pending.items()}  # nothing hangs
    assert first_shed.json()["error"]["code"] == "shed"
    assert int(first_shed.headers["Retry-After"]) >= 1
    shed = [r for r in normal if responses[r].status_code == 503]
    assert all(responses[r].json()["error"]["code"] == "shed" for r in shed)
    assert all(responses[r].status_code in (200, 503) for r in responses), {r: x.text for r, x in responses.items()}
    assert all(responses[r].status_code == 200 for r in high), {r: responses[r].text for r in high}
    served = [resp.json()["id"] for resp in responses.values() if resp.status_code == 200]
    high = [responses[r].json()["id"] for r in high]
    assert 2 <= len(served) - len(high) <= len(normal) - 1
    kinds = ledger_kinds(platform, tenant_id)
    # Refused before it queued: nothing reserved for any shed request.
    assert sum(k == ["GenerationRejected"] for k in kinds.values()) == len(shed), kinds
    assert_settled_once(platform, tenant_id, served)
    started = {env.correlation_id: env.payload for env in of_tenant(platform, topics.OUTCOMES.name, tenant_id)
               if env.event_type == "GenerationStarted"}
    waited = sorted(started[r].queued_ms for r in high)
    assert waited[-1] <= HIGH_QUEUE_BOUND_MS, f"high priority waited {waited} ms"
