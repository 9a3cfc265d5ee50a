"""Structured outputs through the whole platform: a `response_format` of `json_schema`
travels on the request's sampling through admission and the work topic to the engine,
which holds the (tiny, random) model's output to the schema; a schema the engine could
not run is a 400 at the door, with nothing reserved for it."""
from __future__ import annotations

import json

import jsonschema

from models import topics
from tests.e2e.test_cancel import events_of, settlement, tenant_events
from tests.e2e.test_streaming import sse_frames
from tests.harness import MODEL_ALIAS

# Every value is bounded, so even a random model ends the object within the token budget.
VERDICT = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "score": {"type": "boolean"}},
           "required": ["answer", "score"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Is it raining? Answer as JSON."}]


def schema_format(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema, "strict": True}}


def assert_validates(text: str) -> None:
    jsonschema.validate(json.loads(text), VERDICT)


def test_a_json_schema_chat_completion_is_json_that_validates_against_it(platform):
    tenant_id, secret = platform.tenant()
    body = {"model": MODEL_ALIAS, "messages": MESSAGES, "max_tokens": 200, "seed": 7,
            "response_format": schema_format(VERDICT)}
    with platform.client(secret) as client:
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        completion = response.json()
        [choice] = completion["choices"]
        assert choice["finish_reason"] == "stop", completion
        assert_validates(choice["message"]["content"])

        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as streamed:
            assert streamed.status_code == 200, streamed.read()
            chunks = [data for _, data in sse_frames(streamed) if data != "[DONE]"]
        assert_validates("".join(c["choices"][0]["delta"].get("content") or "" for c in chunks))

    # The schema rode on the request's event, and the generation settled as any other.
    [requested] = events_of(platform.admin_log, tenant_id, completion["id"], topics.REQUESTS, "GenerationRequested")
    spec = requested.payload.sampling.structured_output
    assert spec.kind == "json_schema" and json.loads(spec.json_schema) == VERDICT
    settled = settlement(platform, tenant_id, completion["id"])
    assert settled.terminal_status == "completed"
    assert settled.output_tokens == completion["usage"]["completion_tokens"]


def test_a_json_schema_generation_is_json_that_validates_against_it(platform):
    _, secret = platform.tenant()
    with platform.client(secret) as client:
        response = client.post("/v1/generations", json={
            "model_alias": MODEL_ALIAS, "input": "Is it raining?", "max_output_tokens": 200, "stream": False,
            "response_format": schema_format(VERDICT)})
    assert response.status_code == 200, response.text
    assert response.json()["finish_reason"] == "stop", response.json()
    assert_validates(response.json()["output"])


def test_json_object_holds_the_output_to_a_json_object(platform):
    # Nothing bounds an object's size, so a random model need not close one: what it writes is
    # an object's start, seed after seed, where free text almost never starts with a brace.
    _, secret = platform.tenant()
    with platform.client(secret) as client:
        for seed in range(3):
            response = client.post("/v1/chat/completions", json={
                "model": MODEL_ALIAS, "messages": MESSAGES, "max_tokens": 16, "seed": seed,
                "response_format": {"type": "json_object"}})
            assert response.status_code == 200, response.text
            content = response.json()["choices"][0]["message"]["content"]
            assert content.lstrip().startswith("{"), content


BAD = [
    ({"type": "object", "properties": {"a": {"type": "nonsense"}}}, "not a valid JSON Schema"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "the engine cannot compile it"),
]


def test_a_schema_the_engine_cannot_run_is_a_400_and_nothing_is_reserved(platform):
    tenant_id, secret = platform.tenant()
    with platform.client(secret) as client:
        for schema, says in BAD:
            for path, body in [
                ("/v1/chat/completions", {"model": MODEL_ALIAS, "messages": MESSAGES, "max_tokens": 8}),
                ("/v1/completions", {"model": MODEL_ALIAS, "prompt": "x", "max_tokens": 8}),
                ("/v1/generations", {"model_alias": MODEL_ALIAS, "input": "x", "max_output_tokens": 8}),
            ]:
                for stream in (False, True):
                    refused = client.post(path, json={**body, "stream": stream, "response_format": schema_format(schema)})
                    assert refused.status_code == 400, (path, refused.text)
                    error = refused.json()["error"]
                    assert error["param"] == "response_format" and error["code"] == "invalid_value", error
                    assert error["message"].startswith("response_format: json_schema.schema") and says in error["message"]
        # A good request after them: once it has settled, the log is past any the bad ones could have written.
        good = client.post("/v1/chat/completions", json={"model": MODEL_ALIAS, "messages": MESSAGES, "max_tokens": 4,
                                                        "response_format": {"type": "text"}})
        assert good.status_code == 200, good.text
    settlement(platform, tenant_id, good.json()["id"])
    reserved = [e for e in tenant_events(platform.admin_log, topics.LEDGER, tenant_id) if e.event_type == "BudgetReserved"]
    assert [e.correlation_id for e in reserved] == [good.json()["id"]]
    requested = [e for e in tenant_events(platform.admin_log, topics.REQUESTS, tenant_id)
                 if e.event_type == "GenerationRequested"]
    assert [e.correlation_id for e in requested] == [good.json()["id"]]
