"""Tenant isolation on every route that takes a generation id: another tenant's
generation answers exactly as a missing one does (404), and its stream never leaks."""
from __future__ import annotations

import uuid

from tests.harness import MODEL_ALIAS

BODY = {"model_alias": MODEL_ALIAS, "input": "private words", "max_output_tokens": 4, "stream": False}


def calls(client, request_id: str) -> list:
    return [
        client.get(f"/v1/generations/{request_id}"),
        client.post(f"/v1/generations/{request_id}/cancel"),
        client.get(f"/v1/generations/{request_id}/events"),
        client.get(f"/v1/generations/{request_id}/events", headers={"Last-Event-ID": "0"}),
    ]


def test_another_tenants_generation_is_indistinguishable_from_a_missing_one(platform):
    _, secret_a = platform.tenant()
    _, secret_b = platform.tenant()
    with platform.client(secret_a) as a, platform.client(secret_b) as b:
        created = a.post("/v1/generations", json=BODY)
        assert created.status_code == 200
        theirs = created.json()["id"]
        missing = "gen_" + uuid.uuid4().hex
        for own in calls(a, theirs):
            assert own.status_code == 200, own.text
        for foreign, absent in zip(calls(b, theirs), calls(b, missing)):
            assert foreign.status_code == absent.status_code == 404
            assert foreign.json() == {"error": {**absent.json()["error"],
                                                "message": absent.json()["error"]["message"].replace(missing, theirs)}}
        assert a.get(f"/v1/generations/{theirs}").json()["status"] in ("completed", "running", "queued")


def test_the_same_client_chosen_request_id_in_two_tenants_stays_apart(platform):
    _, secret_a = platform.tenant()
    _, secret_b = platform.tenant()
    request_id = "order-" + uuid.uuid4().hex[:8]
    with platform.client(secret_a) as a, platform.client(secret_b) as b:
        first = a.post("/v1/generations", json={**BODY, "request_id": request_id, "input": "alpha"})
        assert first.status_code == 200, first.text
        reused = a.post("/v1/generations", json={**BODY, "request_id": request_id})
        assert reused.status_code == 409
        assert b.get(f"/v1/generations/{request_id}").status_code == 404
        with b.stream("GET", f"/v1/generations/{request_id}/events") as response:
            assert response.status_code == 404
        second = b.post("/v1/generations", json={**BODY, "request_id": request_id, "input": "beta"}, timeout=30)
        assert second.status_code == 200, second.text
        assert second.json()["id"] != first.json()["id"], "ids on the log stay unique across tenants"
        for client, created in ((a, first), (b, second)):
            status = client.get(f"/v1/generations/{request_id}").json()  # the chosen id finds one's own
            assert status["id"] == created.json()["id"]
