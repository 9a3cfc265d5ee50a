"""Admin over HTTP: tenants, keys, limits and model aliases are admin events, take effect
at once, and a tenant sees only the models it is allowed."""
from __future__ import annotations

import uuid

from tests.harness import MODEL_ALIAS


def test_admin_routes_need_the_admin_scope(platform):
    _, plain = platform.tenant()
    with platform.client(plain) as client:
        denied = client.get("/v1/admin/tenants")
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "insufficient_scope"
    with platform.client() as client:
        assert client.get("/v1/admin/tenants").status_code == 401


def test_tenant_key_and_limits_lifecycle(platform):
    _, operator = platform.tenant(scopes=("admin",))
    new_id = "acme-" + uuid.uuid4().hex[:8]
    with platform.client(operator) as ops:
        created = ops.post("/v1/admin/tenants", json={"tenant_id": new_id, "name": "Acme"})
        assert created.status_code == 201 and created.json()["name"] == "Acme"
        assert ops.post("/v1/admin/tenants", json={"tenant_id": new_id}).status_code == 409
        assert ops.post("/v1/admin/tenants", json={"tenant_id": "Not Valid"}).status_code == 400
        assert new_id in [t["tenant_id"] for t in ops.get("/v1/admin/tenants").json()["data"]]

        issued = ops.post(f"/v1/admin/tenants/{new_id}/keys", json={"scopes": ["generate"]})
        assert issued.status_code == 201
        key = issued.json()
        assert key["api_key"].startswith("llm-") and key["scopes"] == ["generate"]
        assert ops.post("/v1/admin/tenants/nobody-here/keys", json={}).status_code == 404

        limits = ops.put(f"/v1/admin/tenants/{new_id}/limits", json={"max_output_tokens": 2, "max_concurrent": 4})
        assert limits.status_code == 200
        assert limits.json()["limits"] | {"max_output_tokens": 2, "max_concurrent": 4} == limits.json()["limits"]
        lifted = ops.patch(f"/v1/admin/tenants/{new_id}/limits", json={"max_concurrent": None})
        assert lifted.json()["limits"]["max_concurrent"] is None and lifted.json()["limits"]["max_output_tokens"] == 2
        assert ops.put(f"/v1/admin/tenants/{new_id}/limits", json={"max_concurrent": -1}).status_code == 400

        with platform.client(key["api_key"]) as tenant:
            body = {"model_alias": MODEL_ALIAS, "input": "hi", "max_output_tokens": 3, "stream": False}
            refused = tenant.post("/v1/generations", json=body)
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "output_too_large"
            ok = tenant.post("/v1/generations", json={**body, "max_output_tokens": 2, "ignore_eos": True})
            assert ok.status_code == 200 and ok.json()["usage"]["output_tokens"] == 2

            detail = ops.get(f"/v1/admin/tenants/{new_id}").json()
            assert [k["key_id"] for k in detail["keys"]] == [key["key_id"]]
            assert ops.post(f"/v1/admin/keys/{key['key_id']}/revoke").json()["revoked"] is True
            assert tenant.get("/v1/models").status_code == 401
        assert ops.post("/v1/admin/keys/key_nope/revoke").status_code == 404


def test_a_tenant_sees_and_uses_only_the_aliases_it_is_allowed(platform):
    _, operator = platform.tenant(scopes=("admin",))
    insider_id, insider = platform.tenant()
    _, outsider = platform.tenant()
    private = "private-" + uuid.uuid4().hex[:8]
    with platform.client(operator) as ops:
        made = ops.put(f"/v1/admin/aliases/{private}",
                       json={"model_revision": platform.model_revision, "allowed_tenants": [insider_id]})
        assert made.status_code == 200
        assert ops.put("/v1/admin/aliases/x", json={"model_revision": "no-such-revision"}).status_code == 404

    with platform.client(insider) as client:
        listed = client.get("/v1/models").json()["data"]
        assert {m["id"] for m in listed} >= {MODEL_ALIAS, private}
        assert all(m["model_revision"] == platform.model_revision for m in listed if m["id"] == private)
        assert client.get(f"/v1/models/{private}").json()["model_revision"] == platform.model_revision
        used = client.post("/v1/generations", json={"model_alias": private, "input": "hi", "max_output_tokens": 2,
                                                    "stream": False})
        assert used.status_code == 200 and used.json()["model_revision"] == platform.model_revision
    with platform.client(outsider) as client:
        assert private not in {m["id"] for m in client.get("/v1/models").json()["data"]}
        assert client.get(f"/v1/models/{private}").status_code == 404
        forbidden = client.post("/v1/generations", json={"model_alias": private, "input": "hi", "stream": False})
        assert forbidden.status_code == 404
