"""Operators apart from tenant admins, over every `/v1/admin` route the app serves.

The routes are read from the app itself, so a route added later without a place in
`POLICY` fails here until someone decides who may use it. A tenant admin reaches its own
tenant only (any other is a 404, as if it did not exist) and no platform route (403); a
plain tenant key reaches no admin route at all."""
from __future__ import annotations

import uuid

from fastapi.routing import APIRoute

from pipelines.admin import commands as admin

OPERATOR, TENANT, LIST = "operator only", "its own tenant", "lists its own tenant"
POLICY = {
    ("POST", "/v1/admin/tenants"): OPERATOR,
    ("GET", "/v1/admin/tenants"): LIST,
    ("GET", "/v1/admin/tenants/{tenant_id}"): TENANT,
    ("POST", "/v1/admin/tenants/{tenant_id}/keys"): TENANT,
    ("PUT", "/v1/admin/tenants/{tenant_id}/limits"): TENANT,
    ("PATCH", "/v1/admin/tenants/{tenant_id}/limits"): TENANT,
    ("POST", "/v1/admin/keys/{key_id}/revoke"): TENANT,
    ("POST", "/v1/admin/keys/{key_id}/rotate"): TENANT,
    ("POST", "/v1/admin/keys/{key_id}/expiry"): TENANT,
    ("POST", "/v1/admin/tenants/{tenant_id}/suspend"): OPERATOR,
    ("POST", "/v1/admin/tenants/{tenant_id}/reinstate"): OPERATOR,
    ("POST", "/v1/admin/models"): OPERATOR,
    ("GET", "/v1/admin/models"): OPERATOR,
    ("PUT", "/v1/admin/aliases/{alias}"): OPERATOR,
    ("DELETE", "/v1/admin/aliases/{alias}"): OPERATOR,
    ("POST", "/v1/admin/models/{model_revision:path}/retire"): OPERATOR,
    ("GET", "/v1/admin/fleet"): OPERATOR,
    ("POST", "/v1/admin/rollouts"): OPERATOR,
    ("GET", "/v1/admin/rollouts"): OPERATOR,
    ("GET", "/v1/admin/rollouts/history/{rollout_id}"): OPERATOR,
    ("GET", "/v1/admin/rollouts/{alias}"): OPERATOR,
    ("POST", "/v1/admin/rollouts/{alias}/{action}"): OPERATOR,
    ("POST", "/v1/admin/rollouts/{alias}/candidate"): OPERATOR,
    ("POST", "/v1/admin/evals"): OPERATOR,
    ("GET", "/v1/admin/evals"): OPERATOR,
    ("PUT", "/v1/admin/tenants/{tenant_id}/cache/{alias}"): TENANT,
    ("POST", "/v1/admin/tenants/{tenant_id}/cache/invalidate"): TENANT,
    ("GET", "/v1/admin/tenants/{tenant_id}/cache"): TENANT,
    ("PUT", "/v1/admin/routers/{alias}"): OPERATOR,
    ("GET", "/v1/admin/routers/{alias}"): OPERATOR,
    ("DELETE", "/v1/admin/routers/{alias}"): OPERATOR,
    ("POST", "/v1/admin/revisions/{model_revision:path}/drain"): OPERATOR,
}


def admin_routes(app) -> list[tuple[str, str]]:
    return sorted((method, route.path) for route in app.routes if isinstance(route, APIRoute)
                  and route.path.startswith("/v1/admin") for method in route.methods - {"HEAD"})


def valid_body(method: str, path: str, platform) -> dict | None:
    """A body each route accepts, so what answers is authorization, not validation. Nothing
    here can harm the shared platform if a check were missing: names are fresh or unknown."""
    if path.endswith("/keys"):
        return {"scopes": ["generate"]}
    if path.endswith("/limits"):
        return {"max_concurrent": 1}
    if path.endswith("/rotate"):
        return {"old_key_valid_for_s": 0}
    if path.endswith("/expiry"):
        return {"expires_at": "2000-01-01T00:00:00Z"}
    if path == "/v1/admin/tenants" and method == "POST":
        return {"tenant_id": "matrix-" + uuid.uuid4().hex[:8]}
    if path == "/v1/admin/models":
        return {"alias": "matrix-" + uuid.uuid4().hex[:8], "model_revision": platform.model_revision,
                "model_path": "/nowhere", "engine_config_hash": "x", "max_model_len": 8}
    if path.startswith("/v1/admin/aliases") and method == "PUT":
        return {"model_revision": "no-such-revision"}
    return None if method in ("GET", "DELETE") else {}


def url(path: str, victim_tenant: str, victim_key: str) -> str:
    return (path.replace("{tenant_id}", victim_tenant).replace("{key_id}", victim_key)
            .replace("{alias}", "matrix-none").replace("{model_revision:path}", "no-such-revision")
            .replace("{rollout_id}", "no-such-rollout").replace("{action}", "rollback"))


def test_every_admin_route_has_a_policy(platform):
    routes = admin_routes(platform.app)
    assert set(routes) == set(POLICY), "an admin route without a decided policy (or a policy for none)"


def test_a_tenant_admin_neither_reads_nor_changes_another_tenant_and_a_plain_key_reaches_none(platform):
    _, operator = platform.tenant(scopes=("operator",))
    own_id, tenant_admin = platform.tenant(scopes=("tenant_admin",))
    victim_id, victim_secret = platform.tenant()
    with platform.client(operator) as ops:
        victim_before = ops.get(f"/v1/admin/tenants/{victim_id}").json()
    victim_key = victim_before["keys"][0]["key_id"]
    _, plain = platform.tenant(scopes=("generate", "batch", "usage", "audit"))

    with platform.client(tenant_admin) as ta, platform.client(plain) as pk:
        for method, path in admin_routes(platform.app):
            target, body = url(path, victim_id, victim_key), valid_body(method, path, platform)
            as_tenant_admin = ta.request(method, target, json=body)
            as_plain = pk.request(method, target, json=body)
            assert as_plain.status_code == 403, (method, path, as_plain.text)
            assert as_plain.json()["error"]["code"] == "insufficient_scope"
            policy = POLICY[method, path]
            if policy == OPERATOR:
                assert as_tenant_admin.status_code == 403, (method, path, as_tenant_admin.text)
                assert as_tenant_admin.json()["error"]["code"] == "insufficient_scope"
            elif policy == TENANT:
                assert as_tenant_admin.status_code == 404, (method, path, as_tenant_admin.text)
                assert victim_id not in as_tenant_admin.text or "does not exist" in as_tenant_admin.text
            else:
                assert as_tenant_admin.status_code == 200, (method, path, as_tenant_admin.text)
                assert [t["tenant_id"] for t in as_tenant_admin.json()["data"]] == [own_id]

    with platform.client(operator) as ops:
        assert ops.get(f"/v1/admin/tenants/{victim_id}").json() == victim_before, "the other tenant is unchanged"
    with platform.client(victim_secret) as victim:
        assert victim.get("/v1/models").status_code == 200, "its key still works"


def test_a_tenant_admin_manages_its_own_keys_and_limits_within_the_grant(platform):
    _, operator = platform.tenant(scopes=("operator",))
    own_id, tenant_admin = platform.tenant(scopes=("tenant_admin",))
    with platform.client(operator) as ops:
        granted = ops.patch(f"/v1/admin/tenants/{own_id}/limits", json={"max_concurrent": 4, "max_output_tokens": 20})
        assert granted.status_code == 200, granted.text
    with platform.client(tenant_admin) as ta:
        assert ta.get(f"/v1/admin/tenants/{own_id}").status_code == 200
        issued = ta.post(f"/v1/admin/tenants/{own_id}/keys", json={"scopes": ["generate", "usage"]})
        assert issued.status_code == 201, issued.text
        for scopes in (["operator"], ["admin"], ["generate", "admin"]):
            refused = ta.post(f"/v1/admin/tenants/{own_id}/keys", json={"scopes": scopes})
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "insufficient_scope"

        tighter = ta.patch(f"/v1/admin/tenants/{own_id}/limits", json={"max_concurrent": 2, "requests_per_minute": 50})
        assert tighter.status_code == 200, tighter.text
        assert tighter.json()["limits"]["max_concurrent"] == 2 and tighter.json()["granted"]["max_concurrent"] == 4
        assert tighter.json()["limits"]["requests_per_minute"] == 50
        for beyond in ({"max_concurrent": 5}, {"max_output_tokens": 21}, {"pool": "mine"}, {"may_send_high": True},
                       {"fair_share_weight": 9.0}, {"window_seconds": 10}):
            refused = ta.patch(f"/v1/admin/tenants/{own_id}/limits", json=beyond)
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "beyond_grant", (beyond, refused.text)
        assert ta.get(f"/v1/admin/tenants/{own_id}").json()["limits"]["max_concurrent"] == 2

        with platform.client(issued.json()["api_key"]) as app_key:
            body = {"model_alias": "tiny", "input": "hi", "max_output_tokens": 21, "stream": False}
            too_long = app_key.post("/v1/generations", json=body)
            assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "output_too_large"
            revoked = ta.post(f"/v1/admin/keys/{issued.json()['key_id']}/revoke")
            assert revoked.status_code == 200 and app_key.get("/v1/models").status_code == 401

        # An operator key of its own tenant is the operator's to manage: rotating it would
        # hand the tenant admin an operator key.
        ops_key = admin.issue_key(platform.view, tenant_id=own_id, actor="tests", scopes=("operator",))[1]
        for action in ("rotate", "revoke", "expiry"):
            body = {"expires_at": "2000-01-01T00:00:00Z"} if action == "expiry" else {}
            refused = ta.post(f"/v1/admin/keys/{ops_key.payload.key_id}/{action}", json=body)
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "insufficient_scope", action

    with platform.client(operator) as ops:  # the operator lowers the grant below the tenant's own limit
        lowered = ops.patch(f"/v1/admin/tenants/{own_id}/limits", json={"max_concurrent": 1})
        assert lowered.json()["limits"]["max_concurrent"] == 1
        history = ops.get(f"/v1/admin/tenants/{own_id}").json()
        assert history["granted"]["max_concurrent"] == 1
