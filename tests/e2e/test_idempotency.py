"""`Idempotency-Key`: a retry with the same key and body is the same generation (its
stream replayed, nothing run or reserved twice); the same key with another body is 409."""
from __future__ import annotations

import threading
import uuid

from openai import OpenAI

from models import topics
from tests.e2e.test_cancel import tenant_events
from tests.e2e.test_streaming import sse_frames
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until
from tests.conftest import platform_both_ways

platform = platform_both_ways()  # each test also runs with admission in the worker

BODY = {"model_alias": MODEL_ALIAS, "input": "the same question", "max_output_tokens": 24, "ignore_eos": True}


def stream(client, body: dict, key: str) -> list:
    with client.stream("POST", "/v1/generations", json=body, headers={"Idempotency-Key": key}) as response:
        assert response.status_code == 200, response.read()
        return list(sse_frames(response))


def reservations(platform, tenant_id: str) -> list:
    return [e for e in tenant_events(platform.admin_log, topics.LEDGER, tenant_id) if e.event_type == "BudgetReserved"]


def test_a_retry_with_the_same_key_replays_the_same_generation(platform):
    tenant_id, secret = platform.tenant()
    key = str(uuid.uuid4())
    with platform.client(secret) as client:
        first = stream(client, BODY, key)
        retry = stream(client, BODY, key)
        collected = client.post("/v1/generations", json={**BODY, "stream": False}, headers={"Idempotency-Key": key})
    assert first[-2][1]["type"] == "completed"
    assert retry == first, "the same frames, ids included"
    # A non-streamed retry differs in body (`stream`), so it is another request: 409.
    assert collected.status_code == 409 and collected.json()["error"]["code"] == "idempotency_key_reused"
    assert len(reservations(platform, tenant_id)) == 1, "reserved once, run once"


def test_a_retry_racing_its_original_joins_its_stream(platform):
    tenant_id, secret = platform.tenant()
    key = str(uuid.uuid4())
    results: dict[str, list] = {}

    def send(name: str) -> None:
        with platform.client(secret) as client:
            results[name] = stream(client, {**BODY, "max_output_tokens": 200}, key)

    threads = [threading.Thread(target=send, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results["a"] == results["b"]
    assert results["a"][-2][1]["type"] == "completed"
    wait_until(lambda: reservations(platform, tenant_id), 10, what="the reservation")
    assert len(reservations(platform, tenant_id)) == 1


def test_the_same_key_with_another_body_is_a_409_and_runs_nothing(platform):
    tenant_id, secret = platform.tenant()
    key = str(uuid.uuid4())
    with platform.client(secret) as client:
        stream(client, BODY, key)
        conflict = client.post("/v1/generations", json={**BODY, "input": "another question"},
                               headers={"Idempotency-Key": key})
        malformed = client.post("/v1/generations", json=BODY, headers={"Idempotency-Key": "has spaces"})
    assert conflict.status_code == 409
    assert conflict.json()["error"]["type"] == "conflict_error"
    assert malformed.status_code == 400 and malformed.json()["error"]["param"] == "Idempotency-Key"
    assert len(reservations(platform, tenant_id)) == 1


def test_non_streamed_and_openai_retries_get_the_same_response(platform):
    _, secret = platform.tenant()
    key = str(uuid.uuid4())
    with platform.client(secret) as client:
        body = {**BODY, "stream": False}
        first = client.post("/v1/generations", json=body, headers={"Idempotency-Key": key})
        again = client.post("/v1/generations", json=body, headers={"Idempotency-Key": key})
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()

    client = OpenAI(base_url=platform.base_url + "/v1", api_key=secret, max_retries=0)
    ask = dict(model=MODEL_ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
               extra_headers={"Idempotency-Key": key + "-chat"})
    one, two = client.chat.completions.create(**ask), client.chat.completions.create(**ask)
    assert one.id == two.id and one.choices[0].message.content == two.choices[0].message.content


def test_keys_belong_to_their_tenant(platform):
    _, secret_a = platform.tenant()
    _, secret_b = platform.tenant()
    key = str(uuid.uuid4())
    with platform.client(secret_a) as a, platform.client(secret_b) as b:
        from_a = stream(a, BODY, key)
        from_b = stream(b, {**BODY, "input": "something else"}, key)
    assert from_a[0][1]["request_id"] != from_b[0][1]["request_id"]
