"""Tenant quotas read model: the limits in force, usage per minute, open reservations.

Windows are not stored: usage is kept per tenant per minute (by the event's time, never
the clock), and `queries.tenant_quota` sums the minutes of a window at read time. The
accounting is the admission processor's (`models.quota`): a window holds the open
reservations in full plus what was settled in it; the rate counts reservations; the
concurrency counts open reservations. Admission decides from its own state, to the
second; this is what the API shows, to the minute.

Interactive generations only; batch budgets are the batch dispatcher's to report.
"""
from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import Connection

from models import topics
from models.authz import tighten
from models.limits import LIMIT_FIELDS, LIMITS, OWN_LIMIT_FIELDS
from models.quota import Limits
from models.tables import open_reservations, quota_usage, tenant_limits
from pipelines.projections.base import Event, Projection
from pipelines.projections.sql import add_to, delete_by_keys, insert_new, select_by_keys, upsert

COUNTERS = ("requests", "tokens", "cost_micros")


def minute_of(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


class QuotasProjection(Projection):
    name = "quotas"
    tables = (tenant_limits, quota_usage, open_reservations)
    handles = frozenset({"TenantLimitsChanged", "TenantOwnLimitsChanged", "BudgetReserved", "UsageSettled",
                         "ReservationExpired"})

    def apply(self, conn: Connection, events: list[Event]) -> None:
        usage: dict[tuple, dict] = {}
        opened: dict[tuple, dict] = {}
        closed: set[tuple] = set()
        limits: dict[str, dict] = {}

        def bucket(e: Event) -> dict:
            key = (e.tenant_id, minute_of(e.at()))
            if key not in usage:
                usage[key] = {"tenant_id": key[0], "minute": key[1], "requests": 0, "tokens": 0, "cost_micros": 0}
            return usage[key]

        admin = [e for e in events if e.topic == topics.ADMIN.name
                 and e.type in ("TenantLimitsChanged", "TenantOwnLimitsChanged")]
        if admin:
            tenants = {(e.payload.get("tenant_id") or e.tenant_id,) for e in admin}
            limits = {r["tenant_id"]: r for r in select_by_keys(conn, tenant_limits, tenants)}
        for e in events:
            p = e.payload
            if e.type in ("TenantLimitsChanged", "TenantOwnLimitsChanged") and e.topic == topics.ADMIN.name:
                # One admin partition, read in order: the last change of a batch is the one in force.
                tenant = p.get("tenant_id") or e.tenant_id
                limits[tenant] = fold_limits(limits.get(tenant), e)
            elif e.type == "BudgetReserved":
                bucket(e)["requests"] += 1
                key = (e.tenant_id, p["request_id"])
                opened[key] = {"tenant_id": key[0], "request_id": key[1], "reservation_id": p.get("reservation_id"),
                               "tokens": p.get("tokens", 0), "cost_micros": p.get("cost_micros", 0),
                               "reserved_at": e.at()}
            elif e.type in ("UsageSettled", "ReservationExpired"):
                # A reservation and its end are in one ledger partition, so the end never comes first.
                key = (e.tenant_id, p["request_id"])
                if opened.pop(key, None) is None:
                    closed.add(key)
                if e.type == "UsageSettled":
                    b = bucket(e)
                    b["tokens"] += p.get("input_tokens", 0) + p.get("output_tokens", 0)
                    b["cost_micros"] += p.get("cost_micros", 0)

        delete_by_keys(conn, open_reservations, closed)
        insert_new(conn, open_reservations, list(opened.values()))
        add_to(conn, quota_usage, list(usage.values()), COUNTERS)
        upsert(conn, tenant_limits, list(limits.values()))


def fold_limits(row: dict | None, e: Event) -> dict:
    """A tenant's limits row after one admin event: the grant and its own limits kept
    apart (JSON), the columns the lower of the two, as admission applies them."""
    p = e.payload
    if row is None:
        grant, own = {}, {}
    else:  # a row without a grant predates own limits: its columns are the grant
        grant = json.loads(row["granted"]) if row.get("granted") else {f: row[f] for f in LIMIT_FIELDS}
        own = json.loads(row["own_limits"]) if row.get("own_limits") else {}
    if e.type == "TenantLimitsChanged":
        # A limit absent from events older than it has its default.
        grant = {spec.name: spec.normal(p.get(spec.name)) for spec in LIMITS}
    else:
        own = {f: p.get(f) for f in OWN_LIMIT_FIELDS}
    in_force = tighten(Limits(**{spec.name: spec.normal(grant.get(spec.name)) for spec in LIMITS}), own)
    return {"tenant_id": p.get("tenant_id") or e.tenant_id, **in_force.as_dict(), "changed_at": e.at(),
            "changed_by": p.get("actor"), "granted": json.dumps(grant, sort_keys=True),
            "own_limits": json.dumps(own, sort_keys=True) if own else None}
