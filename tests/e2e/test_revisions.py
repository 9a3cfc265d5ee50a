"""Revision-true serving: every request runs on a worker of the revision it was pinned to,
two revisions are served side by side, a revision no live worker serves is refused at once,
and a re-pointed alias sends new requests to its new revision. A fake engine serves the
second revision beside the shared tiny vLLM engine; both logs."""
from __future__ import annotations

import time
import uuid

import pytest

from models import topics
from models.events import decode
from pipelines.admin import commands as admin
from tests.e2e.test_streaming import request_events
from tests.fake_engine import FakeEngine
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until
from workers.engine_runner import EngineRunner


def decode_record(record):
    return decode(record.value)


def generate(client, alias: str, request_id: str):
    return client.post("/v1/generations", json={"model_alias": alias, "input": "pinned", "max_output_tokens": 4,
                                                "ignore_eos": True, "request_id": request_id, "stream": False})


def started_of(platform, request_id: str):
    [started] = wait_until(lambda: [env.payload for _, env in request_events(platform.admin_log, request_id,
                                                                              topics.OUTCOMES)
                                    if env.event_type == "GenerationStarted"], 30, what=f"{request_id}'s start")
    return started


@pytest.fixture
def second_revision(platform):
    """A second approved revision under an alias of its own, with no worker yet:
    (alias, revision)."""
    tag = uuid.uuid4().hex[:8]
    alias, revision = f"fake-{tag}", f"fake@{tag}"
    admin.approve_model(platform.view, alias=alias, model_revision=revision,
                        model_path=str(platform.runner.engine.config.model), engine_config_hash="fake",
                        max_model_len=512, actor="tests", price_input_per_1k_micros=1000,
                        price_output_per_1k_micros=9000)
    return alias, revision


def test_a_revision_no_live_worker_serves_is_refused_at_once(platform, second_revision):
    alias, _ = second_revision
    tenant_id, secret = platform.tenant()
    with platform.client(secret) as client:
        began = time.monotonic()
        refused = generate(client, alias, f"ghost-{uuid.uuid4().hex[:8]}")
        took_s = time.monotonic() - began
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "no_capacity"
        assert int(refused.headers["Retry-After"]) >= 1
        assert took_s < 5, f"refused after {took_s:.1f}s"
        served = generate(client, MODEL_ALIAS, f"served-{uuid.uuid4().hex[:8]}")
        assert served.status_code == 200
    # Of this tenant, only the served request reached the log: the reader got past where the
    # refused one would be, and found nothing of it.
    for topic in (topics.PROMPTS, topics.REQUESTS):
        of_tenant = {env.correlation_id for env in map(decode_record, platform.admin_log.read_topic(topic.name))
                     if env.tenant_id == tenant_id}
        assert of_tenant == {served.json()["id"]}, f"{topic.name} holds {of_tenant}"


def test_two_revisions_side_by_side_each_request_runs_on_its_own(platform, second_revision):
    alias, revision = second_revision
    runner = EngineRunner(FakeEngine(hold=False), name="fake-engine").start()
    loop = platform.start_worker(runner=runner, revision=revision, max_in_flight=4)
    try:
        _, secret = platform.tenant()
        with platform.client(secret) as client:
            wait_until(lambda: client.get(f"/v1/models/{alias}").json()["serving"]["workers"] >= 1, 30,
                       what="the fleet to show the second revision's worker")
            pinned = {}
            for i in range(3):
                for use, rev in ((MODEL_ALIAS, platform.model_revision), (alias, revision)):
                    request_id = f"{use}-{i}-{uuid.uuid4().hex[:6]}"
                    response = generate(client, use, request_id)
                    assert response.status_code == 200, response.text
                    assert response.json()["model_revision"] == rev
                    pinned[response.json()["id"]] = (rev, response.json()["output"])
        hashes = {platform.model_revision: platform.runner.engine.engine_config_hash(), revision: "fake"}
        for request_id, (rev, _) in pinned.items():
            started = started_of(platform, request_id)
            assert (started.model_revision, started.engine_config_hash) == (rev, hashes[rev])
        outputs = {rev: {out for r, out in pinned.values() if r == rev} for rev in hashes}
        assert outputs[revision] == {"x"} and "x" not in outputs[platform.model_revision]
        assert runner.engine.started and len(runner.engine.started) == 3
    finally:
        loop.halt()
        runner.close()
    # Its only worker gone (it said so as it left), the revision is refused again.
    with platform.client(secret) as client:
        wait_until(lambda: client.get(f"/v1/models/{alias}").json()["serving"]["workers"] == 0, 15,
                   what="the fleet to show the second revision's worker gone")
        assert generate(client, alias, f"after-{uuid.uuid4().hex[:6]}").status_code == 503


def test_a_re_pointed_alias_sends_new_requests_to_its_new_revision(platform, second_revision):
    alias, revision = second_revision
    _, secret = platform.tenant()
    with platform.client(secret) as client:
        assert generate(client, alias, f"before-{uuid.uuid4().hex[:6]}").status_code == 503
        admin.set_alias(platform.view, alias=alias, model_revision=platform.model_revision, actor="tests")
        began = time.monotonic()
        request_id = f"after-{uuid.uuid4().hex[:6]}"
        response = wait_until(lambda: (r := generate(client, alias, request_id)).status_code == 200 and r, 15,
                              what="the re-pointed alias to reach the tiny revision")
        took_s = time.monotonic() - began
    assert response.json()["model_revision"] == platform.model_revision
    assert started_of(platform, response.json()["id"]).model_revision == platform.model_revision
    assert took_s < 5, f"the new pin took {took_s:.1f}s to apply"


def test_an_alias_re_pointed_under_load_moves_new_requests_only(platform, second_revision):
    """Requests keep coming while the alias moves from the fake revision to the tiny one:
    each runs on the revision it was pinned to, those sent well after the change are all on
    the new one, and those answered before it on the old one."""
    alias, revision = second_revision
    runner = EngineRunner(FakeEngine(hold=False), name="fake-engine").start()
    loop = platform.start_worker(runner=runner, revision=revision, max_in_flight=4)
    sent: list[tuple[float, float, str, str]] = []  # (sent at, answered at, pinned revision, id)
    try:
        _, secret = platform.tenant()
        with platform.client(secret) as client:
            wait_until(lambda: client.get(f"/v1/models/{alias}").json()["serving"]["workers"] >= 1, 30,
                       what="the fleet to show the second revision's worker")

            def one() -> None:
                at = time.monotonic()
                response = generate(client, alias, f"load-{uuid.uuid4().hex[:8]}")
                assert response.status_code == 200, response.text
                sent.append((at, time.monotonic(), response.json()["model_revision"], response.json()["id"]))
            for _ in range(4):
                one()
            changed_at = time.monotonic()
            admin.set_alias(platform.view, alias=alias, model_revision=platform.model_revision, actor="tests")
            while time.monotonic() - changed_at < 3:
                one()
    finally:
        loop.halt()
        runner.close()
    bound_s = 1.0
    assert all(pinned == revision for at, done, pinned, _ in sent if done < changed_at)
    after = [pinned for at, _, pinned, _ in sent if at > changed_at + bound_s]
    assert after and set(after) == {platform.model_revision}, f"after the change: {after}"
    for _, _, pinned, request_id in sent:
        assert started_of(platform, request_id).model_revision == pinned
