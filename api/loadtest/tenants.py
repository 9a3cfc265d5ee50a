"""A load test's own tenants on the platform: with the platform admin's token, each
workload tenant gets a tenant of its own (`<prefix><name>`) through the admin API and a
fresh key to send with. Making them is idempotent: a tenant that exists already is reused
and only a new key is issued (the API shows a key once, so an old one cannot be read back).

Only the platform has these routes; vLLM's own server takes any key and needs none made.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

import httpx

from api.loadtest.workload import Tenant, Workload, WorkloadError

DEFAULT_PREFIX = "loadtest-"
SCOPES = ["generate"]


@dataclass(frozen=True)
class Made:
    """One tenant made or reused for the load test."""

    name: str  # the workload's
    tenant_id: str  # the platform's
    created: bool  # False: it existed and was reused


def tenant_id_for(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    """A platform tenant id for a workload tenant: lowercase letters, digits, '-' and '_'."""
    tenant_id = re.sub(r"[^a-z0-9_-]+", "-", f"{prefix}{name}".lower()).strip("-")
    if not tenant_id or not tenant_id[0].isalnum() or len(tenant_id) > 63:
        raise WorkloadError(f"tenant {name!r}: {tenant_id!r} cannot be a platform tenant id "
                            "(1-63 lowercase letters, digits, '-' or '_'); choose another --tenant-prefix or name")
    return tenant_id


def _admin_base(target: str) -> str:
    base = target.rstrip("/")
    return (base[:-3] if base.endswith("/v1") else base) + "/v1/admin"


def _refusal(response: httpx.Response, what: str) -> WorkloadError:
    try:
        error = response.json().get("error") or {}
        reason = error.get("message") or error.get("code") or response.text
    except (ValueError, AttributeError):
        reason = response.text.strip()[:200] or response.reason_phrase
    hint = " (is the admin token the platform's LEDGERLM_BOOTSTRAP_TOKEN?)" if response.status_code in (401, 403) \
        else ""
    return WorkloadError(f"{what}: HTTP {response.status_code}: {reason}{hint}")


def make_tenant(client: httpx.Client, base: str, tenant_id: str) -> tuple[bool, str]:
    """Makes `tenant_id` unless it exists, and issues it a key: (created, key)."""
    made = client.post(f"{base}/tenants", json={"tenant_id": tenant_id, "name": f"load test: {tenant_id}"})
    if made.status_code not in (201, 409):  # 409: it exists, and is reused
        raise _refusal(made, f"making tenant {tenant_id!r}")
    issued = client.post(f"{base}/tenants/{tenant_id}/keys", json={"scopes": SCOPES, "application_id": "loadtest"})
    if issued.status_code != 201:
        raise _refusal(issued, f"issuing a key to tenant {tenant_id!r}")
    return made.status_code == 201, issued.json()["api_key"]


def provide_keys(workload: Workload, tenants: list[Tenant], target: str, admin_token: str, *,
                 prefix: str = DEFAULT_PREFIX, timeout_s: float = 30.0) -> list[Made]:
    """Gives each of `tenants` (of the workload) a platform tenant and a fresh key, in place."""
    base = _admin_base(target)
    ids = {t.name: tenant_id_for(t.name, prefix) for t in tenants}
    keys: dict[str, str] = {}
    made: list[Made] = []
    headers = {"Authorization": f"Bearer {admin_token}"}
    try:
        with httpx.Client(headers=headers, timeout=timeout_s) as client:
            for t in tenants:
                created, keys[t.name] = make_tenant(client, base, ids[t.name])
                made.append(Made(t.name, ids[t.name], created))
    except httpx.HTTPError as exc:
        raise WorkloadError(f"cannot reach the platform's admin API at {base}: {exc}") from None
    workload.tenants = [replace(t, api_key=keys[t.name]) if t.name in keys else t for t in workload.tenants]
    return made
