"""Job status of every generation (`generations`) and its usage-ledger row once settled.

A generation's events come from three topics (requests, ledger, outcomes), so a replay
may see them in any interleaving. `merge` is written so the final row is the same for
every interleaving: each column has one source, or a fixed precedence between sources
(settlement over terminal event over request), or takes the max (the output tokens a client that went away had received: from the
cancel its API asked for, the settlement, or `OutputDelivered`); where two events of
the same type could disagree (two terminal events), both sit in one partition and the
first by offset wins. The unit tests check this over all orders of a request's events.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection

from models.tables import generations, usage_daily, usage_ledger
from pipelines.projections.base import Event, Projection
from pipelines.projections.sql import select_by_keys, upsert
from pipelines.projections.usage_daily import Rollup

TERMINAL = {"GenerationCompleted": "completed", "GenerationFailed": "failed", "GenerationCancelled": "cancelled"}
TYPES = frozenset({"GenerationRequested", "BudgetReserved", "CacheHit", "GenerationAdmitted", "GenerationRejected",
                   "GenerationStarted", "UsageSettled", "CancelRequested", "OutputDelivered", *TERMINAL})

Row = dict[str, Any]
# Where the output tokens a client received are said, when fewer than all: the cancel its
# API asked for, `OutputDelivered`, a failure of the stream append, the settlement.
_DELIVERED_FROM = frozenset({"UsageSettled", "CancelRequested", "OutputDelivered", "GenerationFailed"})


def new_row(tenant_id: str, request_id: str) -> Row:
    row: Row = {c.name: None for c in generations.columns}
    row.update(tenant_id=tenant_id, request_id=request_id, status="requested", input_tokens=0, output_tokens=0,
               cost_micros=0, settled=False)
    return row


def derive_status(row: Row) -> str:
    if row["settled"]:
        return row["status"]  # the settlement's terminal status is final
    if row["outcome"]:
        return row["outcome"]
    if row["reject_reason"]:
        return "rejected"
    if row["started_at"] is not None:
        return "running"
    if row["reservation_id"]:
        return "queued"
    return "requested"


def _finish_reason(event_type: str, payload: dict) -> str:
    if event_type == "GenerationCompleted":
        return payload.get("finish_reason")
    return "error" if event_type == "GenerationFailed" else "cancelled"


def merge(row: Row, e: Event) -> None:
    """Folds one event into a generation's row (in place)."""
    p, t = e.payload, e.type
    if t == "GenerationRequested":
        row.update(application_id=p.get("application_id"), key_id=p.get("key_id"), model_alias=p.get("model_alias"),
                   model_revision=p.get("model_revision"), priority=p.get("priority"), created_at=e.at(),
                   route_rule=p.get("route_rule"), fallback_from=p.get("fallback_from"),
                   prompt_tokens=p.get("input_tokens"))
        if row["outcome"] is None and not row["settled"]:
            row["input_tokens"] = p.get("input_tokens", 0)
    elif t == "BudgetReserved":
        row.update(reservation_id=p.get("reservation_id"), reserved_tokens=p.get("tokens"),
                   reserved_cost_micros=p.get("cost_micros"))
    elif t == "GenerationAdmitted":
        row["reservation_id"] = row["reservation_id"] or p.get("reservation_id")
    elif t == "GenerationRejected":
        row["reject_reason"] = p.get("reason")
        if row["outcome"] is None:
            row["ended_at"] = e.at()
    elif t == "GenerationStarted":
        if row["started_at"] is None:
            row["started_at"] = e.at()
        row["queued_ms"] = max(row["queued_ms"] or 0, p.get("queued_ms") or 0)
    elif t == "CacheHit":  # answered at once: it ends as it starts
        row["cache_entry_id"] = p.get("entry_id")
        if row["started_at"] is None:
            row["started_at"] = e.at()
        if row["outcome"] is None:
            row.update(outcome="completed", finish_reason=p.get("finish_reason"), ttft_ms=0, duration_ms=0,
                       ended_at=e.at(), queued_ms=0)
    elif t in TERMINAL:
        timings = p.get("timings") or {}
        row["queued_ms"] = max(row["queued_ms"] or 0, timings.get("queued_ms") or 0)
        if row["outcome"] is None:  # a late second terminal event changes nothing, as in settlement
            row.update(outcome=TERMINAL[t], finish_reason=_finish_reason(t, p), ttft_ms=timings.get("ttft_ms"),
                       duration_ms=timings.get("duration_ms"), ended_at=e.at(),
                       error_code=p.get("error_code") if t == "GenerationFailed" else p.get("reason"))
            if not row["settled"]:
                row.update(input_tokens=p.get("input_tokens", 0), output_tokens=p.get("output_tokens", 0))
    elif t == "UsageSettled":
        if not row["settled"]:
            row.update(settled=True, status=p.get("terminal_status"), input_tokens=p.get("input_tokens", 0),
                       output_tokens=p.get("output_tokens", 0), cost_micros=p.get("cost_micros", 0),
                       settled_at=e.at())
            row["reservation_id"] = row["reservation_id"] or p.get("reservation_id")
    if p.get("delivered_output_tokens") is not None and t in _DELIVERED_FROM:
        row["delivered_output_tokens"] = max(row["delivered_output_tokens"] or 0, p["delivered_output_tokens"])
    row["status"] = derive_status(row)


def utc(value: datetime | None) -> datetime | None:
    """Times as aware UTC: SQLite hands them back naive (they are stored in UTC), and
    PostgreSQL in its session's time zone, which need not be UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def delivered(row: Row) -> int | None:
    """Output tokens its client received, where it went away early (never more than were
    generated); None: all of them."""
    count = row["delivered_output_tokens"]
    return None if count is None else min(count, row["output_tokens"])


def usage_row(row: Row) -> Row:
    settled_at = utc(row["settled_at"])
    return {
        "tenant_id": row["tenant_id"], "source": "generation", "source_id": row["request_id"], "batch_id": None,
        "application_id": row["application_id"], "key_id": row["key_id"], "model_alias": row["model_alias"],
        "model_revision": row["model_revision"], "input_tokens": row["input_tokens"],
        "output_tokens": row["output_tokens"], "cost_micros": row["cost_micros"],
        "delivered_output_tokens": delivered(row), "queued_ms": row["queued_ms"],
        "ttft_ms": row["ttft_ms"], "duration_ms": row["duration_ms"], "finish_reason": row["finish_reason"],
        "terminal_status": row["status"], "settled_at": settled_at, "day": settled_at.strftime("%Y-%m-%d"),
        "cached": True if row["cache_entry_id"] else None,
    }


class GenerationsProjection(Projection):
    name = "generations"
    tables = (generations, usage_ledger, usage_daily)
    handles = TYPES

    def apply(self, conn: Connection, events: list[Event]) -> None:
        keyed = [((e.tenant_id, e.payload.get("request_id") or e.correlation_id), e) for e in events]
        rows = {(r["tenant_id"], r["request_id"]): r for r in select_by_keys(conn, generations, {k for k, _ in keyed})}
        # The ledger rows as they stand, to move their share of the daily rollup.
        before = {k: usage_row(r) for k, r in rows.items() if r["settled"]}
        for key, e in keyed:
            row = rows.get(key)
            if row is None:
                row = rows[key] = new_row(*key)
            merge(row, e)
        changed = [rows[k] for k in dict.fromkeys(k for k, _ in keyed)]
        upsert(conn, generations, changed)
        # The ledger row follows the generation's row, so it too ends the same in any order.
        ledger = {(r["tenant_id"], r["request_id"]): usage_row(r) for r in changed if r["settled"]}
        upsert(conn, usage_ledger, list(ledger.values()))
        rollup = Rollup()
        for key, row in ledger.items():
            rollup.change(before.get(key), row)
        rollup.write(conn)
