"""`Idempotency-Key` where the overload ladder served a request on a router's fallback:
the retry is that same generation (run and charged once); and on generation cancels.
Both logs."""
from __future__ import annotations

import uuid

from tests.e2e.test_idempotency import reservations
from tests.fleet_pool import pool_of
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until


def test_a_keyed_request_a_fallback_served_is_the_same_generation_when_retried(platform):
    _, operator = platform.tenant(scopes=("admin",))
    tenant_id, secret = platform.tenant()
    svc = platform.app.state.services
    with pool_of(platform, workers=1, pause_s=0.002, name="small") as small, \
            platform.client(operator) as ops, platform.client(secret) as client:
        with pool_of(platform, workers=1, pause_s=0.002, name="big") as big:
            alias = big.alias
            rules = [{"name": "tagged", "tag": "cheap", "revision": small.revision}]
            set_ = ops.put(f"/v1/admin/routers/{alias}", json={"rules": rules, "fallbacks": [small.revision]})
            assert set_.status_code == 200, set_.text
        wait_until(lambda: not svc.fleet.serves_soon("interactive", big.revision), 30,
                   what="the fleet view to lose the big revision's worker")
        body = {"model_alias": alias, "input": "hi", "max_output_tokens": 2, "ignore_eos": True, "stream": False}
        key = str(uuid.uuid4())
        first = client.post("/v1/generations", json=body, headers={"Idempotency-Key": key})
        assert first.status_code == 200, first.text
        assert first.headers["X-Fallback-From"] == big.revision, "the ladder served it"
        retry = client.post("/v1/generations", json=body, headers={"Idempotency-Key": key})
        assert retry.status_code == 200, retry.text
        assert retry.json()["id"] == first.json()["id"] and retry.json()["output"] == first.json()["output"]
        conflict = client.post("/v1/generations", json={**body, "input": "another"}, headers={"Idempotency-Key": key})
        assert conflict.status_code == 409, conflict.text
        assert ops.delete(f"/v1/admin/routers/{alias}").status_code == 200
    wait_until(lambda: reservations(platform, tenant_id), 10, what="the reservation")
    assert len(reservations(platform, tenant_id)) == 1, "run and reserved once"


def test_a_generation_cancel_retried_with_its_key_answers_the_same(platform):
    _, secret = platform.tenant()
    body = {"model_alias": MODEL_ALIAS, "input": "cancel me", "max_output_tokens": 4, "stream": False}
    with platform.client(secret) as client:
        made = client.post("/v1/generations", json=body)
        assert made.status_code == 200, made.text
        gen_id, key = made.json()["id"], str(uuid.uuid4())
        cancel = client.post(f"/v1/generations/{gen_id}/cancel", headers={"Idempotency-Key": key})
        assert cancel.status_code == 200, cancel.text
        assert client.post(f"/v1/generations/{gen_id}/cancel", headers={"Idempotency-Key": key}).json() == \
            cancel.json()
        other = client.post("/v1/generations", json=body).json()["id"]
        reused = client.post(f"/v1/generations/{other}/cancel", headers={"Idempotency-Key": key})
        assert reused.status_code == 409 and key in reused.json()["error"]["message"], reused.text
        bad = client.post(f"/v1/generations/{gen_id}/cancel", headers={"Idempotency-Key": "x" * 256})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "Idempotency-Key"
