"""Input that used to break the API: text that is not text (lone UTF-16 surrogates), in any
string of any body, is a clean 400 before anything reaches the log; an internal error is
a 500 in the OpenAI shape on a connection that stays usable."""
from __future__ import annotations

import json

import pytest

from models import topics
from tests.e2e.api_alone import MODEL_ALIAS

CHAT = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
TEXT = {"model": MODEL_ALIAS, "prompt": "x", "max_tokens": 2}
GEN = {"model_alias": MODEL_ALIAS, "input": "x", "max_output_tokens": 2, "stream": False}
LONE = "\udfff"


def post(client, path: str, body, headers=None):
    # json.dumps escapes a lone surrogate as \udfff, which is what a hostile client sends.
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json",
                                                                  **(headers or {})})


def assert_refused(response, param: str | None = None) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_encoding", error
    if param is not None:
        assert error["param"] == param, error


HOSTILE = [
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": LONE}]}, "messages.0.content"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
     "messages.0.content.0.text"),
    ("/v1/chat/completions", {**CHAT, "stop": LONE}, "stop"),
    ("/v1/chat/completions", {**CHAT, "stop": ["ok", LONE]}, "stop.1"),
    ("/v1/chat/completions", {**CHAT, "user": LONE}, "user"),
    ("/v1/chat/completions", {**CHAT, "model": LONE}, "model"),
    ("/v1/chat/completions", {**CHAT, "metadata": {"k": LONE}}, "metadata.k"),
    ("/v1/chat/completions", {**CHAT, "ignored_extra": LONE}, "ignored_extra"),
    ("/v1/completions", {**TEXT, "stop": LONE}, "stop"),
    ("/v1/completions", {**TEXT, "stop": [LONE]}, "stop.0"),
    ("/v1/completions", {**TEXT, "prompt": [LONE]}, "prompt.0"),
    ("/v1/generations", {**GEN, "stop": [LONE]}, "stop.0"),
    ("/v1/generations", {**GEN, "request_id": LONE}, "request_id"),
    ("/v1/generations", {**GEN, "input": "a" + LONE}, "input"),
    ("/v1/batches", {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "metadata": {"a": LONE}},
     "metadata.a"),
    ("/v1/summarizations", {"model": MODEL_ALIAS, "input_url": LONE}, "input_url"),
]


@pytest.mark.parametrize("path,body,param", HOSTILE, ids=[f"{p}:{w}" for p, _, w in HOSTILE])
def test_a_lone_surrogate_anywhere_is_a_400_and_nothing_reaches_the_log(api, path, body, param):
    tenant_id, secret = api.tenant()
    with api.client(secret) as client:
        assert_refused(post(client, path, body), param)
        # With an Idempotency-Key the whole body is hashed, ignored fields too.
        assert_refused(post(client, path, body, {"Idempotency-Key": "k-1"}), param)
    for topic in (topics.PROMPTS, topics.REQUESTS, topics.BATCHES):
        assert api.appended(topic, tenant_id) == [], f"something reached {topic.name}"


def test_a_surrogate_in_a_key_or_as_raw_bytes_is_refused_too(api):
    tenant_id, secret = api.tenant()
    with api.client(secret) as client:
        assert_refused(post(client, "/v1/chat/completions", {**CHAT, LONE: 1}))
        raw = json.dumps(CHAT).replace('"x"', '"\xed\xa0\x80"', 1).encode("latin-1")  # UTF-8 of U+D800
        assert_refused(client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"}))
        no_type = client.post("/v1/chat/completions", content=json.dumps({**CHAT, "stop": LONE}))
        assert_refused(no_type, "stop")  # FastAPI reads a body without a content type as JSON too
    assert api.appended(topics.PROMPTS, tenant_id) == []


def test_real_text_that_looks_like_a_surrogate_passes_the_check(api):
    """A surrogate pair is one real character, and an escaped backslash before 'ud800' is
    plain text: both go on to the last check (no worker here: 503 no_capacity)."""
    _, secret = api.tenant()
    with api.client(secret) as client:
        for content in ("\ud83d\ude00", "\\ud800"):
            response = post(client, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": content}]})
            assert response.status_code == 503 and response.json()["error"]["code"] == "no_capacity", response.text


DEEP = 10_000


@pytest.mark.parametrize("inner", [json.dumps(LONE), "1"], ids=["lone-surrogate", "plain"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/generations", "/v1/batches"])
def test_json_nested_ten_thousand_deep_is_a_400_not_a_500(api, path, inner):
    """Python's JSON reader recurses per level: 10,000 nested arrays, with or without a lone
    surrogate at the bottom, used to end in a RecursionError and a 500."""
    tenant_id, secret = api.tenant()
    body = '{"metadata": {"deep": ' + "[" * DEEP + inner + "]" * DEEP + "}}"
    with api.client(secret) as client:
        response = client.post(path, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400, response.text[:500]
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "nesting_too_deep", error
        assert "128" in error["message"], error
        assert client.get("/v1/models").status_code == 200  # the connection and the API go on
    for topic in (topics.PROMPTS, topics.REQUESTS, topics.BATCHES):
        assert api.appended(topic, tenant_id) == [], f"something reached {topic.name}"


class _Exploding:
    def __getattr__(self, name):
        raise RuntimeError("injected failure")


def test_an_internal_error_is_a_500_in_the_openai_shape_and_the_connection_stays_usable(api):
    _, secret = api.tenant()
    counter = api.services.counter
    with api.client(secret) as client:
        api.services.counter = _Exploding()
        try:
            failed = post(client, "/v1/completions", TEXT)  # counting its input fails
        finally:
            api.services.counter = counter
        assert failed.status_code == 500, failed.text
        assert failed.json()["error"] == {"message": "The server had an error while processing the request",
                                          "type": "server_error", "param": None, "code": "internal_error"}
        # The same client (and its pooled connection) goes on working.
        assert client.get("/v1/models").status_code == 200
        again = post(client, "/v1/chat/completions", CHAT)
        assert again.status_code == 503 and again.json()["error"]["code"] == "no_capacity", again.text


SAMPLING = [("stop", ""), ("stop", [""]), ("seed", 2**64), ("seed", -(2**63) - 1), ("temperature", 3),
            ("top_p", 0), ("stop", ["a", "b", "c", "d", "e"])]
ROUTES = [("/v1/chat/completions", CHAT), ("/v1/completions", TEXT), ("/v1/generations", GEN)]


@pytest.mark.parametrize("field,value", SAMPLING, ids=[f"{f}={v!r}" for f, v in SAMPLING])
def test_sampling_values_the_engine_refuses_are_a_400_naming_the_field_on_every_route(api, field, value):
    tenant_id, secret = api.tenant()
    with api.client(secret) as client:
        for path, body in ROUTES:
            for stream in (False, True):
                response = post(client, path, {**body, field: value, "stream": stream})
                assert response.status_code == 400, (path, response.text)
                error = response.json()["error"]
                assert error["param"] == field and error["message"].startswith(field), (path, error)
        unsupported = post(client, "/v1/chat/completions", {**CHAT, "frequency_penalty": 0.5})
        assert unsupported.status_code == 400 and unsupported.json()["error"]["param"] == "frequency_penalty"
        neutral = post(client, "/v1/chat/completions", {**CHAT, "frequency_penalty": 0, "top_k": -1, "seed": 2**63 - 1})
        assert neutral.status_code == 503, neutral.text  # valid: refused only for want of a worker
    assert api.appended(topics.PROMPTS, tenant_id) == []


def test_a_revision_whose_tokenizer_cannot_load_is_a_503_not_a_crash(api):
    from pipelines.admin import commands as admin
    admin.approve_model(api.view, alias="broken", model_revision="broken@1", model_path="/nonexistent/model",
                        engine_config_hash="x", max_model_len=512, actor="tests")
    tenant_id, secret = api.tenant()
    with api.client(secret) as client:
        for path, body in [("/v1/chat/completions", {**CHAT, "model": "broken"}),
                           ("/v1/completions", {**TEXT, "model": "broken"})]:
            response = post(client, path, body)
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "model_unavailable" and response.headers["retry-after"] == "60"
    assert api.appended(topics.PROMPTS, tenant_id) == []
