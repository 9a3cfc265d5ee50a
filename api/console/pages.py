"""The console's read pages about a tenant's use: usage and spend, limits and what remains of
them, generations and batches. Each page is one request answered from the projections
(usage from the daily rollup, lists a keyset page at a time) and the registry."""
from __future__ import annotations

import base64
import json
import logging
from datetime import date, datetime, timedelta, timezone

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse

from api.console.auth import ConsoleRefusal, UserDep
from api.console.render import bar_chart, count, page
from api.routes.batch_deps import batch_services
from api.deps import projection_db, services
from models.limits import LIMITS, checked_by
from pipelines.projections import console as reads
from pipelines.projections.queries import limits_in_use, tenant_quota

router = APIRouter(prefix="/console", include_in_schema=False)
logger = logging.getLogger(__name__)
DEFAULT_DAYS = 30
MAX_CHART_DAYS = 400  # a longer range is charted by its days with usage only
PAGE_SIZES = (10, 25, 50, 100, 200)


def day_range(start: str | None, end: str | None) -> tuple[date, date]:
    today = datetime.now(timezone.utc).date()
    try:
        last = date.fromisoformat(end) if end else today
        first = date.fromisoformat(start) if start else last - timedelta(days=DEFAULT_DAYS - 1)
    except ValueError:
        raise ConsoleRefusal(400, "Dates are YYYY-MM-DD") from None
    if first > last:
        raise ConsoleRefusal(400, "The start date is after the end date")
    return first, last


def encode_cursor(cursor) -> str | None:
    if cursor is None:
        return None
    at, *rest = cursor
    return base64.urlsafe_b64encode(json.dumps([at.isoformat(), *rest]).encode()).decode()


def decode_cursor(text: str | None):
    if not text:
        return None
    try:
        at, tenant, ident = json.loads(base64.urlsafe_b64decode(text.encode()))
        return datetime.fromisoformat(at), str(tenant), str(ident)
    except (ValueError, TypeError):
        raise ConsoleRefusal(400, "Not a page cursor this console made") from None


def page_size(limit: int | None) -> int:
    return limit if limit in PAGE_SIZES else 50


def daily_series(rows: list[dict], first: date, last: date, field: str) -> list[tuple[str, int]]:
    values = {r["key"]: r[field] for r in rows}
    if (last - first).days >= MAX_CHART_DAYS:
        return sorted(values.items())
    days = [(first + timedelta(days=i)).isoformat() for i in range((last - first).days + 1)]
    return [(d, values.get(d, 0)) for d in days]


@router.get("")
@router.get("/")
def home(user: UserDep):
    return RedirectResponse("/console/usage", status_code=303)


@router.get("/usage")
def usage(request: Request, user: UserDep, tenant: str | None = None, start: str | None = None,
          end: str | None = None, group: str | None = None):
    tenant_id = user.tenant(tenant)
    first, last = day_range(start, end)
    group = group if group in reads.GROUP_COLUMNS else ("tenant" if tenant_id is None else "application")
    db = projection_db(request)
    totals = reads.usage_totals(db, tenant_id=tenant_id, start=first, end=last)
    by_day = reads.usage_by(db, tenant_id=tenant_id, start=first, end=last, group="day", limit=100_000)
    grouped = by_day if group == "day" else reads.usage_by(db, tenant_id=tenant_id, start=first, end=last,
                                                           group=group)
    tokens = daily_series([{**r, "tokens": r["input_tokens"] + r["output_tokens"]} for r in by_day], first, last,
                          "tokens")
    return page(request, "usage.html", user=user, tenant_id=tenant_id, start=first, end=last, group=group,
                groups=list(reads.GROUP_COLUMNS), totals=totals, rows=grouped,
                spend_chart=bar_chart(daily_series(by_day, first, last, "cost_micros"), title="Spend per day"),
                token_chart=bar_chart(tokens, title="Tokens per day", unit=count))


def limit_rows(registry, tenant_id: str, quota: dict) -> list[dict]:
    """Each ceiling of the catalogue (`models.limits`) as admission enforces it (the
    registry's limits in force: the grant tightened by the tenant's own), what is used and
    what remains. A limit that is not set is said to be unset and what still bounds it is
    named: never 'unlimited'."""
    in_force, grant = registry.limits_for(tenant_id), registry.grant_for(tenant_id)
    own = registry.own_limits.get(tenant_id) or {}
    used = limits_in_use(quota["used"], quota["reserved"])
    context = max((r.max_model_len for r in registry.revisions.values()), default=None)
    rows = []
    for spec in LIMITS:
        if not spec.ceiling:
            continue
        limit = getattr(in_force, spec.name)
        bound = None
        if limit is None and spec.check == "request" and spec.unit == "tokens" and context:
            bound = f"not set: bounded by the model's context ({context:,} tokens at most)"
        elif limit is None:
            bound = "not set"
        rows.append({"name": spec.name, "what": spec.label, "unit": spec.unit, "limit": limit,
                     "granted": getattr(grant, spec.name), "own": own.get(spec.name), "used": used.get(spec.name),
                     "bound": bound, "remaining": None if limit is None or spec.name not in used
                     else max(0, limit - used[spec.name])})
    return rows


def standing_rows(limits) -> list[dict]:
    """The catalogue's standings (not ceilings: the pool, the fair-share weight, the right
    to send `high`), each with its label and its value as shown."""
    return [{"name": spec.name, "label": spec.label, "shown": spec.shown(getattr(limits, spec.name))}
            for spec in checked_by("standing")]


@router.get("/limits")
def limits(request: Request, user: UserDep, tenant: str | None = None):
    tenant_id = user.tenant(tenant)
    if tenant_id is None:
        return page(request, "pick_tenant.html", user=user, title="Limits and budgets", target="/console/limits")
    registry = user.registry
    quota = tenant_quota(projection_db(request), tenant_id, datetime.now(timezone.utc))
    return page(request, "limits.html", user=user, **limits_context(registry, tenant_id, quota))


def limits_context(registry, tenant_id: str, quota: dict) -> dict:
    """What the limits page shows of a tenant (`limits.html`)."""
    in_force = registry.limits_for(tenant_id)
    return {"tenant_id": tenant_id, "rows": limit_rows(registry, tenant_id, quota),
            "standings": standing_rows(in_force), "window_s": in_force.window.total_seconds(),
            "window_default": in_force.window_seconds is None, "suspended": tenant_id in registry.suspended,
            "quota": quota}


STATUSES = ("requested", "queued", "running", "completed", "failed", "cancelled", "rejected", "expired")


@router.get("/generations")
def generations(request: Request, user: UserDep, tenant: str | None = None, status: str | None = None,
                before: str | None = None, limit: int | None = None):
    tenant_id = user.tenant(tenant)
    size = page_size(limit)
    rows, cursor = reads.generations_page(projection_db(request), tenant_id=tenant_id, limit=size,
                                          before=decode_cursor(before), status=status if status in STATUSES else None)
    return page(request, "generations.html", user=user, tenant_id=tenant_id, rows=with_chosen_ids(request, rows),
                status=status,
                statuses=STATUSES, next_cursor=encode_cursor(cursor), limit=size, first_page=before is None)


def with_chosen_ids(request: Request, rows: list[dict]) -> list[dict]:
    """The rows with the request_id each one's client chose, where it chose one: the
    projection holds the generation's id only, the API's request index (the last day or
    so) the chosen one. The page shows without them if the log cannot be read now."""
    try:
        chosen = services(request).index.chosen_request_ids((r["tenant_id"], r["request_id"]) for r in rows)
    except Exception:  # noqa: BLE001 - the page answers from the projections whatever the log does
        logger.warning("console: the request_ids clients chose are unavailable now", exc_info=True)
        return rows
    return [{**r, "chosen_request_id": chosen.get((r["tenant_id"], r["request_id"]))} for r in rows]


@router.get("/batches")
def batches(request: Request, user: UserDep, tenant: str | None = None, before: str | None = None,
            limit: int | None = None):
    tenant_id = user.tenant(tenant)
    size = page_size(limit)
    rows, cursor = reads.batches_page(projection_db(request), tenant_id=tenant_id, limit=size,
                                      before=decode_cursor(before))
    return page(request, "batches.html", user=user, tenant_id=tenant_id, rows=rows, next_cursor=encode_cursor(cursor),
                limit=size, first_page=before is None)


@router.get("/batches/{tenant}/{batch_id}")
def batch(request: Request, user: UserDep, tenant: str, batch_id: str):
    tenant_id = user.tenant(tenant)
    bsvc = batch_services(request, request.app.state.services)
    state = bsvc.view.batch(tenant_id, batch_id)
    if state is None:
        raise ConsoleRefusal(404, f"No such batch: {batch_id}")
    files = [("input", state.input_file_id), ("output", state.output_file_id), ("errors", state.error_file_id)]
    summary = None
    if state.summarization is not None:
        prefix = state.summarization.output_prefix
        summary = {"input": bsvc.store.uri(state.input_key), "data": bsvc.store.uri(prefix + "data/"),
                   "manifest": bsvc.store.uri(prefix + "manifest.json")}
    return page(request, "batch.html", user=user, tenant_id=tenant_id, batch=state, files=files, summary=summary,
                usage=state.usage)
