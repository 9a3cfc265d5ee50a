"""Reads of the projected tables, for the API and the CLI. Every read that serves a
tenant takes its tenant id and filters on it: another tenant's row is never returned,
so it looks exactly like a missing one."""
from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Connection, Engine, and_, case, func, select, tuple_

from models.limits import DEFAULT_WINDOW_S, LIMIT_FIELDS, checked_by
from models.quota import Limits
from models.registry import ROLLOUT_STEPS
from models.tables import admin_changes, audit_trail, batch_chunks, batches, generations, open_reservations, quota_usage, \
    tenant_limits, usage_ledger
from pipelines.projections.generations import utc

GroupBy = Literal["day", "model", "application"]
NO_LIMITS = Limits()  # what a tenant that never had a limits event has


def _conn(db: Engine | Connection):
    return db.connect() if isinstance(db, Engine) else _Borrowed(db)


class _Borrowed:
    def __init__(self, conn: Connection):
        self.conn = conn

    def __enter__(self) -> Connection:
        return self.conn

    def __exit__(self, *exc):
        return False


def _iso(value: datetime | None) -> str | None:
    value = utc(value)
    return None if value is None else value.isoformat(timespec="microseconds").replace("+00:00", "Z")


def generation_status(db: Engine | Connection, tenant_id: str, request_id: str) -> dict[str, Any] | None:
    """A generation of this tenant as the projections know it, or None."""
    g = generations.c
    with _conn(db) as conn:
        row = conn.execute(select(generations).where(g.tenant_id == tenant_id, g.request_id == request_id)).first()
    if row is None:
        return None
    return status_from_row(row._mapping)


def status_from_row(r) -> dict[str, Any]:
    """A `generations` row (or the API's live index row of the same shape) as a status."""
    return {
        "request_id": r["request_id"], "status": r["status"], "model_alias": r["model_alias"],
        "model_revision": r["model_revision"], "application_id": r["application_id"],
        "finish_reason": r["finish_reason"], "error_code": r["error_code"] or r["reject_reason"],
        "usage": {"input_tokens": r["input_tokens"], "output_tokens": r["output_tokens"],
                  "delivered_output_tokens": _delivered(r), "cost_micros": r["cost_micros"], "settled": r["settled"]},
        "timings": {"queued_ms": r["queued_ms"], "ttft_ms": r["ttft_ms"], "duration_ms": r["duration_ms"]},
        "created_at": _iso(r["created_at"]), "started_at": _iso(r["started_at"]), "ended_at": _iso(r["ended_at"]),
        "cached": bool(r.get("cache_entry_id")),
        "route": {"rule": r.get("route_rule"), "fallback_from": r.get("fallback_from")},
    }


def _delivered(r) -> int:
    """Output tokens the client received: all of them unless it went away early."""
    delivered = r.get("delivered_output_tokens")
    return r["output_tokens"] if delivered is None else min(delivered, r["output_tokens"])


def batch_status(db: Engine | Connection, tenant_id: str, batch_id: str) -> dict[str, Any] | None:
    b, c = batches.c, batch_chunks.c
    with _conn(db) as conn:
        row = conn.execute(select(batches).where(b.tenant_id == tenant_id, b.batch_id == batch_id)).first()
        if row is None:
            return None
        totals = conn.execute(select(
            func.count(), func.coalesce(func.sum(case((c.status == "completed", 1), else_=0)), 0),
            func.coalesce(func.sum(c.input_tokens), 0), func.coalesce(func.sum(c.output_tokens), 0),
            func.coalesce(func.sum(c.cost_micros), 0)).where(c.tenant_id == tenant_id, c.batch_id == batch_id)).one()
    r = row._mapping
    return {"batch_id": batch_id, "status": r["status"], "model_alias": r["model_alias"],
            "model_revision": r["model_revision"], "request_count": r["request_count"],
            "chunk_count": r["chunk_count"], "chunks_seen": totals[0], "chunks_completed": totals[1],
            "usage": {"input_tokens": totals[2], "output_tokens": totals[3], "cost_micros": totals[4]},
            "created_at": _iso(r["created_at"]), "ended_at": _iso(r["ended_at"])}


def _usage_totals(u):
    return [func.sum(case((u.source == "generation", 1), else_=0)).label("generations"),
            func.sum(case((u.source == "batch_chunk", 1), else_=0)).label("batch_chunks"),
            func.sum(u.input_tokens).label("input_tokens"), func.sum(u.output_tokens).label("output_tokens"),
            func.sum(func.coalesce(u.delivered_output_tokens, u.output_tokens)).label("delivered_output_tokens"),
            func.sum(u.cost_micros).label("cost_micros")]


def usage_summary(db: Engine | Connection, tenant_id: str, *, group_by: GroupBy = "day",
                  start: date | None = None, end: date | None = None) -> list[dict[str, Any]]:
    """The tenant's settled usage, grouped; `start` and `end` are inclusive UTC days."""
    u = usage_ledger.c
    keys = {"day": [u.day], "model": [u.model_alias, u.model_revision], "application": [u.application_id]}[group_by]
    where = [u.tenant_id == tenant_id]
    if start is not None:
        where.append(u.day >= start.isoformat())
    if end is not None:
        where.append(u.day <= end.isoformat())
    query = select(*keys, *_usage_totals(u)).where(*where).group_by(*keys).order_by(*keys)
    with _conn(db) as conn:
        return [{k: (int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                 for k, v in row._mapping.items()} for row in conn.execute(query)]


def month_bounds(month: str) -> tuple[str, str]:
    first = datetime.strptime(month, "%Y-%m").date()
    following = (first.replace(day=28) + timedelta(days=4)).replace(day=1)
    return first.isoformat(), (following - timedelta(days=1)).isoformat()


def usage_report(db: Engine | Connection, month: str) -> list[dict[str, Any]]:
    """Chargeback for a month (YYYY-MM): every tenant, application and model revision."""
    u = usage_ledger.c
    first, last = month_bounds(month)
    keys = [u.tenant_id, u.application_id, u.model_alias, u.model_revision]
    query = (select(*keys, *_usage_totals(u)).where(u.day >= first, u.day <= last)
             .group_by(*keys).order_by(*keys))
    with _conn(db) as conn:
        return [{**row._mapping, "month": month} for row in conn.execute(query)]


def daily_spend(db: Engine | Connection, month: str) -> list[tuple[str, str, int]]:
    """(day, tenant, cost in micros) for every day of the month with usage."""
    u = usage_ledger.c
    first, last = month_bounds(month)
    query = (select(u.day, u.tenant_id, func.sum(u.cost_micros)).where(u.day >= first, u.day <= last)
             .group_by(u.day, u.tenant_id).order_by(u.day, u.tenant_id))
    with _conn(db) as conn:
        return [(d, t, int(c)) for d, t, c in conn.execute(query)]


def tenant_quota(db: Engine | Connection, tenant_id: str, now: datetime) -> dict[str, Any]:
    """Limits, usage in the current window (minute resolution), open reservations, and
    what remains of each limit (None where there is no limit)."""
    now = utc(now)
    with _conn(db) as conn:
        limit_row = conn.execute(select(tenant_limits).where(tenant_limits.c.tenant_id == tenant_id)).first()
        limits = {f: (limit_row._mapping[f] if limit_row else getattr(NO_LIMITS, f)) for f in LIMIT_FIELDS}
        window = limits["window_seconds"] or DEFAULT_WINDOW_S
        q = quota_usage.c

        def used_since(seconds: int):
            since = (now - timedelta(seconds=seconds)).replace(second=0, microsecond=0)
            return conn.execute(select(func.coalesce(func.sum(q.requests), 0), func.coalesce(func.sum(q.tokens), 0),
                                       func.coalesce(func.sum(q.cost_micros), 0))
                                .where(q.tenant_id == tenant_id, q.minute >= since, q.minute <= now)).one()

        _, tokens, cost = used_since(window)
        requests_last_minute = used_since(60)[0]
        o = open_reservations.c
        open_count, reserved_tokens, reserved_cost = conn.execute(
            select(func.count(), func.coalesce(func.sum(o.tokens), 0), func.coalesce(func.sum(o.cost_micros), 0))
            .where(o.tenant_id == tenant_id)).one()

    used = {"requests_last_minute": int(requests_last_minute), "tokens": int(tokens), "cost_micros": int(cost)}
    reserved = {"concurrent": int(open_count), "tokens": int(reserved_tokens), "cost_micros": int(reserved_cost)}
    return {"tenant_id": tenant_id, "window_seconds": window, "limits": limits, "used": used, "reserved": reserved,
            "remaining": {name: None if limits[name] is None else max(0, limits[name] - in_use)
                          for name, in_use in limits_in_use(used, reserved).items()}}


def limits_in_use(used: dict, reserved: dict) -> dict:
    """What counts against each limit of the tenant's use (`models.limits`: its rate,
    concurrency and window checks), from `tenant_quota`'s `used` and `reserved`; open
    reservations count in full, as admission counts them."""
    counted = {"rate": lambda spec: used["requests_last_minute"], "concurrency": lambda spec: reserved["concurrent"],
               "window": lambda spec: used[spec.measure] + reserved[spec.measure]}
    return {spec.name: counted[spec.check](spec) for spec in checked_by(*counted)}


AuditCursor = tuple[datetime, str, int, int]


def audit_events(db: Engine | Connection, *, tenant_id: str | None, since: datetime | None = None,
                 until: datetime | None = None, types: list[str] | None = None, limit: int = 100,
                 after: AuditCursor | None = None) -> tuple[list[dict[str, Any]], AuditCursor | None]:
    """One page of the audit trail in time order; `tenant_id` None means every tenant.
    Returns the page and the cursor of its last row (None when this is the last page)."""
    t = audit_trail.c
    with _conn(db) as conn:
        postgres = conn.dialect.name == "postgresql"
        topic = t.topic.collate("C") if postgres else t.topic  # the same order on both databases
        where = [t.occurred_at.is_not(None)]
        if tenant_id is not None:
            where.append(t.tenant_id == tenant_id)
        if since is not None:
            where.append(t.occurred_at >= utc(since))
        if until is not None:
            where.append(t.occurred_at < utc(until))
        if types:
            where.append(t.event_type.in_(types))
        if after is not None:
            where.append(tuple_(t.occurred_at, topic, t.partition, t.offset) > tuple_(utc(after[0]), *after[1:]))
        rows = conn.execute(select(t.topic, t.partition, t.offset, t.seq, t.event_id, t.event_type, t.tenant_id,
                                   t.correlation_id, t.occurred_at, t.event_hash, t.link, t.event)
                            .where(and_(*where)).order_by(t.occurred_at, topic, t.partition, t.offset)
                            .limit(limit + 1)).all()
    page = [{"topic": r.topic, "partition": r.partition, "offset": r.offset, "seq": r.seq, "event_id": r.event_id,
             "event_type": r.event_type, "tenant_id": r.tenant_id, "correlation_id": r.correlation_id,
             "occurred_at": _iso(r.occurred_at), "event_hash": bytes(r.event_hash).hex(),
             "link": bytes(r.link).hex(), "event": r.event} for r in rows[:limit]]
    more = len(rows) > limit
    last = rows[limit - 1] if more else None
    return page, ((utc(last.occurred_at), last.topic, last.partition, last.offset) if last is not None else None)


ROLLOUT_EVENTS = tuple(e.event_type for e in ROLLOUT_STEPS)  # the registry's list, so none is missed


def rollout_history(db: Engine | Connection, rollout_id: str) -> list[dict[str, Any]]:
    """A rollout's events as projected, in log order (drains, which name a revision, not a
    rollout, are the revision's rows)."""
    import json

    query = (select(admin_changes.c.offset, admin_changes.c.event_type, admin_changes.c.occurred_at,
                    admin_changes.c.actor, admin_changes.c.details)
             .where(admin_changes.c.subject == rollout_id, admin_changes.c.event_type.in_(ROLLOUT_EVENTS))
             .order_by(admin_changes.c.offset))
    with _conn(db) as conn:
        return [{"offset": row.offset, "event_type": row.event_type, "occurred_at": _iso(row.occurred_at),
                 "actor": row.actor, "details": json.loads(row.details)} for row in conn.execute(query)]
