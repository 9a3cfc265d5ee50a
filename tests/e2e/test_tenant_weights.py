"""Tenant limits that are standing, not ceilings: priority `high` only for a tenant an
admin granted it (refused at the API before anything is written, and by admission for
what reaches it anyway), and fair-share weights a pool worker serves by. Both logs; a
slow fake engine serves the flood."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from models import topics
from models.events import decode, new_event
from models.events_generation import GenerationRequested, Position, PromptSubmitted
from pipelines.admin import commands as admin
from pipelines.publish import publish
from tests.e2e.test_admin_cli import ledgerlm, lines
from tests.e2e.test_streaming import request_events
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until
from tests.slow_engine import SlowEngine
from workers.engine_runner import EngineRunner


def of_tenant(platform, topic, tenant_id: str) -> set[str]:
    return {env.correlation_id for env in (decode(r.value) for r in platform.admin_log.read_topic(topic.name))
            if env.tenant_id == tenant_id}


def test_high_priority_needs_a_grant_and_works_once_granted(platform):
    _, operator = platform.tenant(scopes=("admin",))
    tenant_id, secret = platform.tenant()
    body = {"model_alias": MODEL_ALIAS, "input": "urgent", "max_output_tokens": 2, "ignore_eos": True,
            "stream": False, "priority": "high"}
    with platform.client(secret) as client, platform.client(operator) as ops:
        refused = client.post("/v1/generations", json=body)
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert error["code"] == "priority_not_allowed" and error["param"] == "priority"
        assert "may_send_high" in error["message"]
        chat = client.post("/v1/chat/completions", json={"model": MODEL_ALIAS, "max_tokens": 2, "priority": "high",
                                                         "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 403 and chat.json()["error"]["code"] == "priority_not_allowed"
        normal = client.post("/v1/generations", json={**body, "priority": "normal"})
        assert normal.status_code == 200, normal.text
        # Of this tenant, only the normal request reached the log.
        for topic in (topics.PROMPTS, topics.REQUESTS):
            assert of_tenant(platform, topic, tenant_id) == {normal.json()["id"]}, topic.name

        granted = ops.patch(f"/v1/admin/tenants/{tenant_id}/limits", json={"may_send_high": True})
        assert granted.status_code == 200, granted.text
        assert granted.json()["limits"]["may_send_high"] is True
        assert granted.json()["limits"]["fair_share_weight"] == 1.0
        served = client.post("/v1/generations", json=body)
        assert served.status_code == 200, served.text
        assert served.json()["usage"]["output_tokens"] == 2

        assert ops.patch(f"/v1/admin/tenants/{tenant_id}/limits", json={"fair_share_weight": 0}).status_code == 400
        lifted = ops.patch(f"/v1/admin/tenants/{tenant_id}/limits", json={"may_send_high": None})
        assert lifted.json()["limits"]["may_send_high"] is False, "null restores the default: not granted"
        assert client.post("/v1/generations", json=body).status_code == 403
    platform.check()


def requests_for(log, tenant_id: str, revision: str, count: int, *, priority: str = "normal",
                 input_tokens: int = 1, max_output_tokens: int = 4) -> list:
    """`count` generation requests of a tenant as the API would write them (their prompts
    are written here), for the caller to publish on the requests topic."""
    ids = [f"{tenant_id}-{n}-{uuid.uuid4().hex[:6]}" for n in range(count)]
    prompts = publish(log, topics.PROMPTS, [new_event(PromptSubmitted(request_id=i, prompt="flood"),
                                                      tenant_id=tenant_id, correlation_id=i) for i in ids])
    # Far out: the flood is about fair share, not whether admission thinks a deadline can be met.
    deadline = datetime.now(timezone.utc) + timedelta(minutes=30)
    return [new_event(GenerationRequested(
        request_id=i, model_alias="weighted", model_revision=revision, input_tokens=input_tokens, input_sha256="0" * 64,
        max_output_tokens=max_output_tokens, deadline_at=deadline, priority=priority,
        prompt_ref=Position(topic=p.topic, partition=p.partition, offset=p.offset)),
        tenant_id=tenant_id, correlation_id=i) for i, p in zip(ids, prompts)]


def test_admission_refuses_high_that_reaches_it_without_a_grant(platform):
    tenant_id, _ = platform.tenant()
    [request] = requests_for(platform.admin_log, tenant_id, platform.model_revision, 1, priority="high")
    publish(platform.admin_log, topics.REQUESTS, [request])
    [rejected] = wait_until(lambda: [env for _, env in request_events(platform.admin_log, request.correlation_id,
                                                                      topics.LEDGER)], 30, what="admission's decision")
    assert rejected.event_type == "GenerationRejected" and rejected.payload.reason == "priority_not_allowed"
    platform.check()


class RecordingSlowEngine(SlowEngine):
    """Tokens at a fixed pace; records the order in which generations began."""

    def __init__(self, pause_s: float):
        super().__init__(pause_s)
        self.started: list[str] = []

    async def generate(self, request):
        self.started.append(request.request_id)
        async for delta in super().generate(request):
            yield delta


@pytest.fixture
def weighted_revision(platform):
    """A revision of its own served by one slow fake-engine worker of 4 slots:
    (revision, engine)."""
    tag = uuid.uuid4().hex[:8]
    revision = f"weighted@{tag}"
    admin.approve_model(platform.view, alias=f"weighted-{tag}", model_revision=revision,
                        model_path=str(platform.runner.engine.config.model), engine_config_hash="slow-engine",
                        max_model_len=512, actor="tests")
    engine = RecordingSlowEngine(pause_s=0.05)  # 0.2 s a generation
    runner = EngineRunner(engine, name="slow-engine").start()
    loop = platform.start_worker(runner=runner, revision=revision, max_in_flight=4)
    # The flood goes straight onto the requests topic, past the API's wait for a worker:
    # admission must be able to read that this one joined, or it refuses the flood.
    wait_until(lambda: any(env.event_type == "WorkerJoined" and env.payload.worker_id == loop.worker.worker_id
                           for env in (decode(r.value) for r in platform.admin_log.read_topic(topics.FLEET.name))),
               60, what="the weighted worker to join the fleet")
    yield revision, engine
    loop.halt()
    platform.loops.remove(loop)
    runner.close()


def test_weights_share_a_worker_three_to_one_under_a_flood(platform, weighted_revision):
    revision, engine = weighted_revision
    gold, _ = platform.tenant(fair_share_weight=3.0)
    basic, _ = platform.tenant()
    # 256 tokens a request (the prompt's count is what admission and the queue weigh; the
    # fake engine makes 4 tokens of it), one quantum of the worker's fair queue: gold's
    # turn covers three requests, basic's one.
    size = {"input_tokens": 252, "max_output_tokens": 4}
    per_tenant = 64
    flood = [env for pair in zip(requests_for(platform.admin_log, gold, revision, per_tenant, **size),
                                 requests_for(platform.admin_log, basic, revision, per_tenant, **size))
             for env in pair]
    publish(platform.admin_log, topics.REQUESTS, flood)

    def both_busy_for(count: int) -> list[str] | None:
        """`count` starts from one round after basic's first, when both tenants were seen
        and the slots gold took alone are being given back."""
        first = next((n for n, r in enumerate(engine.started) if r.startswith(basic)), None)
        if first is None or len(engine.started) < first + 4 + count:
            return None
        return engine.started[first + 4:first + 4 + count]

    try:
        window = wait_until(lambda: both_busy_for(40), 120, what="the worker to work through the flood")
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}: {flood_state(platform.admin_log, flood, engine)}") from None
    gold_runs = sum(r.startswith(gold) for r in window)
    basic_runs = sum(r.startswith(basic) for r in window)
    assert gold_runs + basic_runs == len(window)
    # Both are backlogged throughout the window (64 each, gold needs about 30 of them).
    assert 2.2 <= gold_runs / max(basic_runs, 1) <= 4.0, f"gold {gold_runs}, basic {basic_runs}"
    # The rest of the flood ends one way or another (served, or refused by capacity-aware
    # admission on a loaded host): nothing is left hanging.
    wanted = {env.correlation_id for env in flood}
    wait_until(lambda: wanted <= ended(platform.admin_log) | set(engine.started), 240, every_s=0.5,
               what="every request of the flood to start or be refused")
    platform.check()


def flood_state(log, flood, engine) -> str:
    """What became of a flood: starts by tenant, and its refusals by reason."""
    wanted = {env.correlation_id for env in flood}
    reasons: dict[str, int] = {}
    for env in map(decode, (r.value for r in log.read_topic(topics.LEDGER.name))):
        if env.correlation_id in wanted and env.event_type == "GenerationRejected":
            reasons[env.payload.reason] = reasons.get(env.payload.reason, 0) + 1
    tenants = {env.tenant_id for env in flood}
    starts = {t: sum(r.startswith(t) for r in engine.started) for t in tenants}
    return f"{len(engine.started)} of {len(flood)} started {starts}, refused {reasons}"


def ended(log) -> set[str]:
    """Request ids with a rejection or a terminal event on the log."""
    records = [*log.read_topic(topics.LEDGER.name), *log.read_topic(topics.OUTCOMES.name)]
    return {env.correlation_id for env in map(decode, (r.value for r in records))
            if env.event_type in ("GenerationRejected", "GenerationCompleted", "GenerationFailed",
                                  "GenerationCancelled", "GenerationExpired")}


def test_admin_cli_sets_weight_and_high_priority(tmp_path):
    assert lines(ledgerlm(tmp_path, "tenant", "create", "acme")) == [{"tenant_id": "acme"}]
    [before] = lines(ledgerlm(tmp_path, "limits", "show", "acme"))
    assert (before["fair_share_weight"], before["may_send_high"]) == (1.0, False)
    [limits] = lines(ledgerlm(tmp_path, "limits", "set", "acme", "--fair-share-weight", "3",
                              "--may-send-high", "yes", "--max-concurrent", "4"))
    assert (limits["fair_share_weight"], limits["may_send_high"], limits["max_concurrent"]) == (3.0, True, 4)
    assert lines(ledgerlm(tmp_path, "limits", "show", "acme")) == [limits]
    [reset] = lines(ledgerlm(tmp_path, "limits", "set", "acme", "--fair-share-weight", "none"))
    assert (reset["fair_share_weight"], reset["may_send_high"], reset["max_concurrent"]) == (1.0, True, 4)
    for bad in (["--fair-share-weight", "0"], ["--may-send-high", "maybe"]):
        result = ledgerlm(tmp_path, "limits", "set", "acme", *bad)
        assert result.returncode == 2 and "--" in result.stderr, result.stderr
