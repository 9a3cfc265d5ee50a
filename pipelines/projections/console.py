"""Reads of the projections for the web console: usage from the daily rollup (never a scan
of the ledger), newest-first keyset pages of generations and batches, and the ledger rows
of a date range as a stream for export.

`tenant_id` None reads every tenant (an operator); otherwise every query is filtered on
it, so another tenant's rows are never read, let alone shown.
"""
from __future__ import annotations

from datetime import date, datetime
from typing import Any, Iterator, Literal

from sqlalchemy import Connection, Engine, and_, func, select, tuple_

from models.tables import batch_chunks, batches, generations, usage_daily, usage_ledger
from pipelines.projections.generations import utc
from pipelines.projections.queries import _conn

UsageGroup = Literal["day", "tenant", "application", "key", "revision"]
GROUP_COLUMNS = {"day": "day", "tenant": "tenant_id", "application": "application_id", "key": "key_id",
                 "revision": "model_revision"}
COUNTERS = ("generations", "batch_chunks", "cached", "input_tokens", "output_tokens", "delivered_output_tokens",
            "cost_micros")
EXPORT_COLUMNS = ("tenant_id", "source", "source_id", "batch_id", "application_id", "key_id", "model_alias",
                  "model_revision", "input_tokens", "output_tokens", "delivered_output_tokens", "cost_micros", "cached",
                  "queued_ms", "ttft_ms", "duration_ms", "finish_reason", "terminal_status", "settled_at", "day")


def _range(table, tenant_id: str | None, start: date, end: date) -> list:
    where = [table.c.day >= start.isoformat(), table.c.day <= end.isoformat()]
    if tenant_id is not None:
        where.append(table.c.tenant_id == tenant_id)
    return where


def usage_by(db: Engine | Connection, *, tenant_id: str | None, start: date, end: date, group: UsageGroup,
             limit: int = 1000) -> list[dict[str, Any]]:
    """Usage summed per `group` over the inclusive UTC days [start, end], largest spend
    first (by day: in day order)."""
    u = usage_daily.c
    key = u[GROUP_COLUMNS[group]].label("key")
    sums = [func.sum(u[c]).label(c) for c in COUNTERS]
    order = [key] if group == "day" else [func.sum(u.cost_micros).desc(), key]
    query = (select(key, *sums).where(*_range(usage_daily, tenant_id, start, end)).group_by(key).order_by(*order)
             .limit(limit))
    with _conn(db) as conn:
        return [{"key": row.key, **{c: int(getattr(row, c) or 0) for c in COUNTERS}} for row in conn.execute(query)]


def usage_totals(db: Engine | Connection, *, tenant_id: str | None, start: date, end: date) -> dict[str, int]:
    u = usage_daily.c
    query = select(*[func.coalesce(func.sum(u[c]), 0).label(c) for c in COUNTERS]).where(
        *_range(usage_daily, tenant_id, start, end))
    with _conn(db) as conn:
        row = conn.execute(query).one()
    return {c: int(getattr(row, c)) for c in COUNTERS}


def ledger_rows(db: Engine, *, tenant_id: str | None, start: date, end: date,
                batch_rows: int = 10_000) -> Iterator[list[tuple]]:
    """The ledger rows of the days [start, end] in (tenant, day) order, `batch_rows` at a
    time, read with a server-side cursor so any range streams in bounded memory."""
    u = usage_ledger.c
    query = (select(*[u[c] for c in EXPORT_COLUMNS]).where(*_range(usage_ledger, tenant_id, start, end))
             .order_by(u.tenant_id, u.day, u.source, u.source_id))
    with db.connect() as conn:
        result = conn.execution_options(stream_results=True, yield_per=batch_rows).execute(query)
        for part in result.partitions(batch_rows):
            yield [tuple(utc(v) if isinstance(v, datetime) else v for v in row) for row in part]


GenerationCursor = tuple[datetime, str, str]  # created_at, tenant, request id of a page's last row


def generations_page(db: Engine | Connection, *, tenant_id: str | None, limit: int = 50,
                     before: GenerationCursor | None = None, status: str | None = None
                     ) -> tuple[list[dict[str, Any]], GenerationCursor | None]:
    """One page of generations, newest first (metadata only: no text is projected), and
    the cursor of the next page (None on the last). A keyset walk: each page costs the
    same however deep it is."""
    g = generations.c
    cols = [g.tenant_id, g.request_id, g.application_id, g.key_id, g.model_alias, g.model_revision, g.priority,
            g.status, g.finish_reason, g.error_code, g.reject_reason, g.input_tokens, g.output_tokens, g.cost_micros,
            g.queued_ms, g.ttft_ms, g.duration_ms, g.cache_entry_id, g.route_rule, g.created_at, g.ended_at]
    where = [g.created_at.is_not(None)]  # a row whose request is not projected yet has no time to order by
    if tenant_id is not None:
        where.append(g.tenant_id == tenant_id)
    if status:
        where.append(g.status == status)
    if before is not None:
        at, tenant, request = before
        if tenant_id is not None:
            where.append(tuple_(g.created_at, g.request_id) < tuple_(utc(at), request))
        else:
            where.append(tuple_(g.created_at, g.tenant_id, g.request_id) < tuple_(utc(at), tenant, request))
    order = [g.created_at.desc(), g.request_id.desc()] if tenant_id is not None else \
        [g.created_at.desc(), g.tenant_id.desc(), g.request_id.desc()]
    with _conn(db) as conn:
        rows = conn.execute(select(*cols).where(and_(*where)).order_by(*order).limit(limit + 1)).all()
    page = [{**row._mapping, "created_at": utc(row.created_at), "ended_at": utc(row.ended_at)} for row in rows[:limit]]
    last = page[-1] if len(rows) > limit else None
    return page, ((last["created_at"], last["tenant_id"], last["request_id"]) if last else None)


BatchCursor = tuple[datetime, str, str]


def batches_page(db: Engine | Connection, *, tenant_id: str | None, limit: int = 50,
                 before: BatchCursor | None = None) -> tuple[list[dict[str, Any]], BatchCursor | None]:
    """One page of batches (summarization jobs are batches too), newest first, each with
    its chunks' usage summed."""
    b, c = batches.c, batch_chunks.c
    where = [b.created_at.is_not(None)]
    if tenant_id is not None:
        where.append(b.tenant_id == tenant_id)
    if before is not None:
        where.append(tuple_(b.created_at, b.tenant_id, b.batch_id) < tuple_(utc(before[0]), before[1], before[2]))
    with _conn(db) as conn:
        rows = conn.execute(select(batches).where(and_(*where))
                            .order_by(b.created_at.desc(), b.tenant_id.desc(), b.batch_id.desc())
                            .limit(limit + 1)).all()
        shown = rows[:limit]
        totals = {}
        if shown:
            keys = [(r.tenant_id, r.batch_id) for r in shown]
            for t in conn.execute(select(c.tenant_id, c.batch_id, func.count(), func.sum(c.input_tokens),
                                         func.sum(c.output_tokens), func.sum(c.cost_micros))
                                  .where(tuple_(c.tenant_id, c.batch_id).in_(keys))
                                  .group_by(c.tenant_id, c.batch_id)):
                totals[t[0], t[1]] = {"chunks_seen": int(t[2]), "input_tokens": int(t[3] or 0),
                                      "output_tokens": int(t[4] or 0), "cost_micros": int(t[5] or 0)}
    empty = {"chunks_seen": 0, "input_tokens": 0, "output_tokens": 0, "cost_micros": 0}
    page = [{**r._mapping, "created_at": utc(r.created_at), "ended_at": utc(r.ended_at),
             **totals.get((r.tenant_id, r.batch_id), empty)} for r in shown]
    last = page[-1] if len(rows) > limit else None
    return page, ((last["created_at"], last["tenant_id"], last["batch_id"]) if last else None)
