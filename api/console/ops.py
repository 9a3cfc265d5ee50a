"""The console's platform pages: the fleet, the audit trail and its verification, rollouts,
and routing and cache policy. The fleet and rollouts are an operator's; the audit trail
and cache policies show a tenant admin its own tenant's only."""
from __future__ import annotations

import asyncio
import hashlib
import threading
from datetime import datetime, timezone

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse

from api.console.auth import UserDep, action_form
from api.console.pages import decode_cursor, encode_cursor, page_size
from api.console.render import page
from api.console.slo import slo_section
from api.fleet_report import fleet_report
from api.deps import projection_db
from pipelines.cache import admin as cache_admin
from pipelines.rollouts import commands as rollouts
from pipelines.admin import routers as router_admin
from pipelines.bootstrap import Bootstrap
from pipelines.fleet import wall_clock
from pipelines.projections.queries import audit_events

router = APIRouter(prefix="/console", include_in_schema=False)
_verify_lock = threading.Lock()  # one verification at a time per process: it reads the whole log


@router.get("/fleet")
def fleet(request: Request, user: UserDep, slo_window: str | None = None):
    user.require_operator()
    services = request.app.state.services
    report = fleet_report(services.fleet.all(), wall_clock(), services.settings.worker_lost_after_s)
    return page(request, "fleet.html", user=user, report=report, slo=slo_section(request, slo_window))


def _audit_cursor(text: str | None):
    cursor = decode_cursor(text)
    if cursor is None:
        return None
    at, topic, position = cursor
    partition, _, offset = position.partition(":")
    return at, topic, int(partition), int(offset)


@router.get("/audit")
def audit(request: Request, user: UserDep, tenant: str | None = None, after: str | None = None,
          limit: int | None = None):
    tenant_id = user.tenant(tenant)
    size = page_size(limit)
    rows, cursor = audit_events(projection_db(request), tenant_id=tenant_id, limit=size, after=_audit_cursor(after))
    for row in rows:  # each row checks on its own: its stored event hashes to its event_hash
        row["hash_ok"] = (row["event"] is not None
                          and hashlib.sha256(row["event"].encode()).hexdigest() == row["event_hash"])
    next_cursor = None if cursor is None else encode_cursor((cursor[0], cursor[1], f"{cursor[2]}:{cursor[3]}"))
    return page(request, "audit.html", user=user, tenant_id=tenant_id, rows=rows, next_cursor=next_cursor, limit=size,
                first_page=after is None, verified=getattr(request.app.state, "console_verified", None))


def _verify(settings) -> dict:
    from pipelines.signing import signer_from_key
    from pipelines.audit.verify import verify

    platform = Bootstrap(settings)
    engine = platform.projection_db()
    try:
        with platform.event_log(create_topics=False) as log:
            report = verify(log, engine, signer_from_key(settings.audit_signing_key))
    finally:
        engine.dispose()
    return {"ok": report.ok, "records": report.records, "partitions": report.partitions,
            "checkpoints": report.checkpoints, "unsigned_tail": report.unsigned_tail,
            "not_in_trail": report.not_in_trail, "seconds": round(report.seconds, 3),
            "findings": [f.line() for f in report.findings]}


@router.post("/audit/verify")
async def verify_now(request: Request, user: UserDep):
    """Recomputes every chain from the log against the trail and its signed checkpoints
    (as `ledgerlm audit verify`); the result is shown on the audit page."""
    await action_form(request, user)
    user.require_operator()
    settings = request.app.state.services.settings

    def run() -> dict:
        with _verify_lock:
            return _verify(settings)

    result = await asyncio.to_thread(run)
    request.app.state.console_verified = {**result, "at": datetime.now(timezone.utc), "by": user.name}
    return RedirectResponse("/console/audit", status_code=303)


@router.get("/rollouts")
def rollout_list(request: Request, user: UserDep):
    user.require_operator()
    shown = sorted(user.registry.rollouts.values(), key=lambda r: r.started_at, reverse=True)
    return page(request, "rollouts.html", user=user, rollouts=[rollouts.describe(r) for r in shown])


@router.get("/routing")
def routing(request: Request, user: UserDep, tenant: str | None = None):
    tenant_id = user.tenant(tenant)
    registry, svc = user.registry, request.app.state.services
    routers = []
    if user.operator:  # rules may name tenants: only an operator sees them
        routers = [{**router_admin.describe(registry, alias), "ladder": svc.ladder.state(alias)}
                   for alias in sorted(registry.routers)]
    tenants = [tenant_id] if tenant_id is not None else sorted(registry.tenants)
    policies = []
    for t in tenants:
        for row in cache_admin.policies(registry, t):
            counts = svc.cache.counts.get((t, row["model_alias"]))
            policies.append({**row, "hits": counts.hits if counts else 0, "misses": counts.misses if counts else 0})
    aliases = registry.aliases_for(tenant_id) if tenant_id is not None else sorted(
        registry.aliases.values(), key=lambda a: a.alias)
    return page(request, "routing.html", user=user, tenant_id=tenant_id, routers=routers, policies=policies,
                aliases=[{"alias": a.alias, "model_revision": a.model_revision, "routed": a.alias in registry.routers,
                          "rollout": a.alias in registry.open_rollouts} for a in aliases])
