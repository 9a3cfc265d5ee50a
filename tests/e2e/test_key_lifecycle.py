"""Keys that expire and rotate, and tenants that are suspended: each an admin event, each
in force at once on every API, and a suspended tenant's running work cancelled and settled."""
from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

from models import topics
from models.events import decode
from tests.e2e.test_cancel import LONG, settlement
from tests.e2e.test_cancel import held  # noqa: F401 - a fixture: a tenant on a worker of its own
from tests.e2e.test_streaming import sse_frames
from tests.helpers import wait_until


def admin_events(platform, event_type: str, **match) -> list:
    records = platform.admin_log.read_partition(topics.ADMIN.name, 0)
    return [env.payload for env in map(decode, (r.value for r in records)) if env.event_type == event_type
            and all(getattr(env.payload, k) == v for k, v in match.items())]


def test_a_rotation_keeps_both_keys_live_until_the_old_one_expires(platform):
    tenant_id, tenant_admin = platform.tenant(scopes=("tenant_admin",))
    with platform.client(tenant_admin) as ta:
        old = ta.post(f"/v1/admin/tenants/{tenant_id}/keys", json={"scopes": ["generate"]}).json()
        rotated = ta.post(f"/v1/admin/keys/{old['key_id']}/rotate", json={"old_key_valid_for_s": 3600})
        assert rotated.status_code == 201, rotated.text
        new = rotated.json()
        assert new["key_id"] != old["key_id"] and new["scopes"] == ["generate"]
        assert new["rotated_from"]["key_id"] == old["key_id"] and new["rotated_from"]["expires_at"]
        with platform.client(old["api_key"]) as old_client, platform.client(new["api_key"]) as new_client:
            assert old_client.get("/v1/models").status_code == 200, "the old key lives on during the rotation"
            assert new_client.get("/v1/models").status_code == 200
            ended = ta.post(f"/v1/admin/keys/{old['key_id']}/expiry",
                            json={"expires_at": (datetime.now(timezone.utc) - timedelta(seconds=1)).isoformat()})
            assert ended.status_code == 200, ended.text
            gone = old_client.get("/v1/models")
            assert gone.status_code == 401 and gone.json()["error"]["code"] == "invalid_api_key"
            assert new_client.get("/v1/models").status_code == 200
        naive = ta.post(f"/v1/admin/keys/{new['key_id']}/expiry", json={"expires_at": "2030-01-01T00:00:00"})
        assert naive.status_code in (400, 422), "a time without its timezone is refused"
    assert admin_events(platform, "ApiKeyIssued", key_id=new["key_id"])[0].rotated_from == old["key_id"]
    assert len(admin_events(platform, "ApiKeyExpirySet", key_id=old["key_id"])) == 2


def test_a_key_issued_with_an_expiry_stops_at_it(platform):
    tenant_id, tenant_admin = platform.tenant(scopes=("tenant_admin",))
    soon = datetime.now(timezone.utc) + timedelta(seconds=2)
    with platform.client(tenant_admin) as ta:
        issued = ta.post(f"/v1/admin/tenants/{tenant_id}/keys", json={"scopes": ["generate"],
                                                                      "expires_at": soon.isoformat()})
        assert issued.status_code == 201, issued.text
        listed = ta.get(f"/v1/admin/tenants/{tenant_id}").json()["keys"]
        assert [k["expires_at"] is not None for k in listed if k["key_id"] == issued.json()["key_id"]] == [True]
    with platform.client(issued.json()["api_key"]) as client:
        wait_until(lambda: client.get("/v1/models").status_code == 401, 15, every_s=0.2, what="the key to expire")
    assert datetime.now(timezone.utc) >= soon


def test_a_suspended_tenant_is_refused_at_once_and_its_running_work_is_cancelled_and_settled(platform, request):
    tenant_id, secret, engine = request.getfixturevalue("held")
    _, operator = platform.tenant(scopes=("operator",))
    ended: dict = {}

    def stream():
        with platform.client(secret) as client, client.stream("POST", "/v1/generations", json=LONG) as response:
            frames = [data for _, data in sse_frames(response)]
            ended["final"] = frames[-2]

    with platform.client(secret) as client:
        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        wait_until(lambda: engine.held, 30, what="the generation to be running")
        with platform.client(operator) as ops:
            suspended = ops.post(f"/v1/admin/tenants/{tenant_id}/suspend", json={"reason": "unpaid"})
            assert suspended.status_code == 200 and suspended.json()["suspended"] is True, suspended.text
            refused = client.get("/v1/models")
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "tenant_suspended"
            reader.join(30)
            assert not reader.is_alive(), "the stream did not end"
            final = ended["final"]
            assert final["type"] == "cancelled" and final["reason"] == "admin", final
            assert settlement(platform, tenant_id, final["request_id"]).terminal_status == "cancelled"
            assert ops.post(f"/v1/admin/tenants/{tenant_id}/suspend").status_code == 409
            assert ops.post(f"/v1/admin/tenants/{tenant_id}/reinstate").status_code == 200
        assert client.get("/v1/models").status_code == 200, "reinstated, its keys work again"
    assert admin_events(platform, "TenantSuspended", tenant_id=tenant_id)[0].reason == "unpaid"
    assert admin_events(platform, "TenantReinstated", tenant_id=tenant_id)
