"""Retiring a revision and deleting an alias, over the HTTP admin API on both logs.

A retired revision's running generation finishes on its worker, while new requests for
its alias are refused with 410 `model_retired` and a request pinned to it before the
retirement is rejected by admission. A deleted alias is an unknown model (404). A gated
fake engine serves the retired revision, so the test decides when its generation ends."""
from __future__ import annotations

import asyncio
import copy
import threading
import uuid

import pytest

from models import topics
from pipelines.admin import commands as admin
from pipelines.generation.idempotency import client_request_id
from pipelines.generation.submission import SubmitGeneration, submit_generation
from pipelines.generation.tokencount import TokenCounter
from tests.e2e.test_streaming import request_events
from tests.fake_engine import FakeEngine
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until
from workers.engine import EngineDelta
from workers.engine_runner import EngineRunner

GATE_LIMIT_S = 120.0  # a gated generation ends by itself after this, so nothing hangs


class GatedEngine(FakeEngine):
    """Each generation runs until `release()`, then completes normally with one token."""

    def __init__(self):
        super().__init__(hold=False)
        self.gate = threading.Event()

    def release(self) -> None:
        self.gate.set()

    async def generate(self, request):
        self.started.append(request.request_id)
        await asyncio.to_thread(self.gate.wait, GATE_LIMIT_S)  # off the engine's loop, which is shared
        yield EngineDelta(request.request_id, "x", 1, 1, True, "length")


def generate(client, alias: str, request_id: str):
    return client.post("/v1/generations", json={"model_alias": alias, "input": "pinned", "max_output_tokens": 4,
                                                "ignore_eos": True, "request_id": request_id, "stream": False})


def ids(client) -> set[str]:
    return {m["id"] for m in client.get("/v1/models").json()["data"]}


@pytest.fixture
def gated_revision(platform):
    """A second approved revision under an alias of its own, served by a gated fake engine:
    (alias, revision, engine)."""
    tag = uuid.uuid4().hex[:8]
    alias, revision = f"gated-{tag}", f"gated@{tag}"
    admin.approve_model(platform.view, alias=alias, model_revision=revision,
                        model_path=str(platform.runner.engine.config.model), engine_config_hash="fake",
                        max_model_len=512, actor="tests")
    engine = GatedEngine()
    runner = EngineRunner(engine, name="gated-engine").start()
    loop = platform.start_worker(runner=runner, revision=revision, max_in_flight=4)
    try:
        yield alias, revision, engine
    finally:
        engine.release()
        loop.halt()
        runner.close()


def test_a_retired_revision_finishes_its_running_work_and_refuses_new_work(platform, gated_revision):
    alias, revision, engine = gated_revision
    _, operator = platform.tenant(scopes=("admin",))
    tenant_id, secret = platform.tenant()
    with platform.client(secret) as client, platform.client(operator) as ops:
        wait_until(lambda: client.get(f"/v1/models/{alias}").json()["serving"]["workers"] >= 1, 30,
                   what="the fleet to show the gated revision's worker")
        assert alias in ids(client)

        running_id = f"running-{uuid.uuid4().hex[:8]}"
        answers = {}

        def run_one():
            with platform.client(secret) as own:
                answers[running_id] = generate(own, alias, running_id)

        runs = threading.Thread(target=run_one, daemon=True)
        runs.start()
        on_log = client_request_id(tenant_id, running_id)
        wait_until(lambda: on_log in engine.started, 30, what="the generation to run on the gated engine")
        # Pinned before the retirement, decided after it: as if submitted just before.
        before = copy.deepcopy(platform.view.refresh())

        retired = ops.post(f"/v1/admin/models/{revision}/retire", json={"reason": "superseded"})
        assert retired.status_code == 200, retired.text
        assert retired.json() == {"model_revision": revision, "retired": True, "reason": "superseded"}

        refused = generate(client, alias, f"refused-{uuid.uuid4().hex[:8]}")
        assert refused.status_code == 410, refused.text
        error = refused.json()["error"]
        assert error["code"] == "model_retired" and revision in error["message"] and "superseded" in error["message"]
        assert alias not in ids(client)
        assert client.get("/v1/models").status_code == 200 and MODEL_ALIAS in ids(client)

        late_id = f"late-{uuid.uuid4().hex[:8]}"
        principal = platform.view.refresh().authenticate(secret)
        submit_generation(SubmitGeneration(request_id=late_id, model_alias=alias, prompt="pinned",
                                           max_output_tokens=4, deadline_ms=None),
                          principal=principal, registry=before, log=platform.admin_log, counter=TokenCounter(),
                          default_deadline_ms=60_000)
        decided = wait_until(lambda: [env for _, env in request_events(platform.admin_log, late_id, topics.LEDGER)],
                             30, what="admission's decision on the late request")
        assert [env.event_type for env in decided] == ["GenerationRejected"], "admitted to a retired revision"
        rejection = decided[0]
        assert rejection.payload.reason == "model_retired" and revision in rejection.payload.message
        assert late_id not in engine.started

        assert runs.is_alive() and answers == {}, "the running generation is left to run"
        engine.release()
        runs.join(60)
        assert not runs.is_alive()
        finished = answers[running_id]
        assert finished.status_code == 200, finished.text
        assert finished.json()["model_revision"] == revision and finished.json()["output"] == "x"
        settled = wait_until(lambda: [env.payload for _, env in request_events(platform.admin_log, on_log,
                                                                               topics.LEDGER)
                                      if env.event_type == "UsageSettled"], 30, what="the running one's settlement")
        assert settled[0].terminal_status == "completed"
        assert engine.started == [on_log], "nothing new reached the retired revision's worker"

        # Admin answers: retirement is final and said so; re-pointing the alias revives it.
        assert ops.post(f"/v1/admin/models/{revision}/retire").status_code == 409
        assert ops.post("/v1/admin/models/no-such-revision/retire").status_code == 404
        assert ops.put(f"/v1/admin/aliases/{alias}", json={"model_revision": revision}).status_code == 409
        assert ops.put(f"/v1/admin/aliases/{alias}",
                       json={"model_revision": platform.model_revision}).status_code == 200
        revived = generate(client, alias, f"revived-{uuid.uuid4().hex[:8]}")
        assert revived.status_code == 200 and revived.json()["model_revision"] == platform.model_revision
    platform.check()


def test_a_deleted_alias_is_an_unknown_model(platform):
    _, operator = platform.tenant(scopes=("admin",))
    _, secret = platform.tenant()
    alias = f"doomed-{uuid.uuid4().hex[:8]}"
    with platform.client(secret) as client, platform.client(operator) as ops:
        assert ops.put(f"/v1/admin/aliases/{alias}", json={"model_revision": platform.model_revision}).status_code \
            == 200
        assert generate(client, alias, f"before-{uuid.uuid4().hex[:8]}").status_code == 200
        assert alias in ids(client)

        deleted = ops.delete(f"/v1/admin/aliases/{alias}")
        assert deleted.status_code == 200 and deleted.json() == {"alias": alias, "deleted": True}

        gone = generate(client, alias, f"after-{uuid.uuid4().hex[:8]}")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found", gone.text
        assert client.get(f"/v1/models/{alias}").status_code == 404
        assert alias not in ids(client)
        again = ops.delete(f"/v1/admin/aliases/{alias}")
        assert again.status_code == 404 and alias in again.json()["error"]["message"]
        # The revision it pointed at is untouched.
        assert generate(client, MODEL_ALIAS, f"other-{uuid.uuid4().hex[:8]}").status_code == 200
    platform.check()


def test_retire_and_delete_need_the_admin_scope(platform):
    _, plain = platform.tenant()
    with platform.client(plain) as client:
        assert client.post(f"/v1/admin/models/{platform.model_revision}/retire").status_code == 403
        assert client.delete(f"/v1/admin/aliases/{MODEL_ALIAS}").status_code == 403
        assert generate(client, MODEL_ALIAS, f"still-{uuid.uuid4().hex[:8]}").status_code == 200
