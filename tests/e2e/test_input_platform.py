"""Hostile input and budgets on the whole platform (real engine, both logs): a lone
surrogate or a value the engine refuses is a 400 before anything is on the log, streamed
or not, and the connection goes on; a token-budget 429 says when the window frees."""
from __future__ import annotations

import json

from models import topics
from models.events import decode
from pipelines.admin import commands as admin
from tests.harness import MODEL_ALIAS

CHAT = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
TEXT = {"model": MODEL_ALIAS, "prompt": "hello", "max_tokens": 2}
GEN = {"model_alias": MODEL_ALIAS, "input": "hello", "max_output_tokens": 2}


def prompts_of(platform, tenant_id: str) -> list:
    return [e for e in (decode(r.value) for r in platform.admin_log.read_topic(topics.PROMPTS.name))
            if e.tenant_id == tenant_id]


def post(client, path: str, body: dict):
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def test_bad_text_and_values_the_engine_refuses_are_400s_with_nothing_on_the_log(platform):
    tenant_id, secret = platform.tenant()
    with platform.client(secret) as client:
        for path, body in [("/v1/chat/completions", CHAT), ("/v1/completions", TEXT), ("/v1/generations", GEN)]:
            for stream in (False, True):
                for field, value in [("stop", "\udfff"), ("stop", ["\ud800"]), ("stop", ""), ("stop", [""]),
                                     ("seed", 2**64)]:
                    response = post(client, path, {**body, field: value, "stream": stream})
                    assert response.status_code == 400, (path, field, value, response.text)
                    assert response.json()["error"]["param"].split(".")[0] == field
        ok = post(client, "/v1/chat/completions", {**CHAT, "seed": 2**63 - 1, "stop": ["\n"]})
        assert ok.status_code == 200, ok.text
    assert len(prompts_of(platform, tenant_id)) == 1, "only the valid request put its prompt on the log"
    platform.check()


def test_a_token_budget_429_says_when_the_window_frees(platform):
    tenant_id, secret = platform.tenant()
    admin.set_limits(platform.view, tenant_id=tenant_id, actor="tests", tokens_per_window=60, window_seconds=3600)
    body = {**GEN, "max_output_tokens": 40, "ignore_eos": True, "stream": False}
    with platform.client(secret) as client:
        first = post(client, "/v1/generations", body)
        assert first.status_code == 200, first.text
        refused = post(client, "/v1/generations", body)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "tokens", refused.text
    # The first one's 40+ tokens stay in the hour's window: nothing fits for about an hour.
    assert 3500 <= int(refused.headers["retry-after"]) <= 3602, refused.headers
    platform.check()
