"""A revision whose model has no chat template: a chat request to it, whole or streamed, is
a 400 `chat_template_missing` naming the revision, and nothing of it reaches the log (no
prompt, no request, so nothing reserved), while completions to the same revision are
served. The platform on an embedded log with fake engines; the models' tokenizers count."""
from __future__ import annotations

import uuid

import pytest

from models import topics
from pipelines.admin import commands as admin
from tests.e2e.fake_platform import FakeTinyEngine, fake_platform
from tests.e2e.test_cancel import tenant_events
from tests.helpers import wait_until
from tests.unit.test_chat_template import without_chat_template
from workers.engine_runner import EngineRunner


@pytest.fixture(scope="module")
def base_model(tmp_path_factory, tiny_model_dir):
    """The platform, and an alias of its own for a revision of the tiny model without a chat
    template, served by a worker of its own: (platform, alias, revision)."""
    home = tmp_path_factory.mktemp("chat-template-missing")
    platform, runner = fake_platform(home, tiny_model_dir)
    bare = without_chat_template(tiny_model_dir, home / "base-model")
    tag = uuid.uuid4().hex[:8]
    alias, revision = f"base-{tag}", f"base@{tag}"
    admin.approve_model(platform.view, alias=alias, model_revision=revision, model_path=str(bare),
                        engine_config_hash="fake", max_model_len=512, actor="tests")
    base_runner = EngineRunner(FakeTinyEngine(bare), name="fake-base-engine").start()
    platform.start_worker(runner=base_runner, revision=revision, max_in_flight=4)
    yield platform, alias, revision
    platform.close()
    base_runner.close()
    runner.close()


def test_chat_to_a_model_without_template_is_a_400_and_nothing_is_reserved(base_model):
    platform, alias, revision = base_model
    tenant_id, secret = platform.tenant()
    chat = {"model": alias, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    with platform.client(secret) as client:
        wait_until(lambda: client.get(f"/v1/models/{alias}").json()["serving"]["workers"] >= 1, 30,
                   what="the fleet to show the base revision's worker")
        for body in (chat, {**chat, "stream": True}):
            refused = client.post("/v1/chat/completions", json=body)
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["code"] == "chat_template_missing" and error["param"] == "messages", error
            assert error["message"] == (f"model revision {revision} has no chat template: use /v1/completions "
                                        f"or approve a model with one")
        for topic in (topics.PROMPTS, topics.REQUESTS, topics.OUTCOMES):
            assert tenant_events(platform.admin_log, topic, tenant_id) == [], f"{topic.name} holds the refused chat"
        served = client.post("/v1/completions", json={"model": alias, "prompt": "hello", "max_tokens": 2})
        assert served.status_code == 200, served.text
        assert served.json()["choices"][0]["text"]
    assert {env.correlation_id for env in tenant_events(platform.admin_log, topics.REQUESTS, tenant_id)} \
        == {served.json()["id"]}, "only the completion reached the log"
