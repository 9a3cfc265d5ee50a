"""Budgets hold under concurrency: many requests of one tenant through two API processes
never jointly overrun its spend, and every request beyond the budget gets a 429."""
from __future__ import annotations

import asyncio
import math

import httpx

from models import topics
from models.events import decode
from pipelines.admin import commands as admin
from pipelines.generation.tokencount import TokenCounter
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until
from tests.conftest import platform_both_ways

platform = platform_both_ways()  # each test also runs with admission in the worker

PROMPT = "hi"
OUTPUT_TOKENS = 2
REQUESTS = 300
FITS = 100


def tenant_ledger(log, tenant_id: str) -> list:
    """The tenant's ledger events in log order (one tenant lives in one partition)."""
    return [env for env in (decode(r.value) for r in log.read_topic(topics.LEDGER.name)) if env.tenant_id == tenant_id]


async def _send_all(urls: list[str], secret: str, count: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    clients = [httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=120,
                                 limits=limits) for url in urls]
    body = {"model_alias": MODEL_ALIAS, "input": PROMPT, "max_output_tokens": OUTPUT_TOKENS, "stream": False,
            "ignore_eos": True}
    try:
        return await asyncio.gather(*(clients[i % len(clients)].post("/v1/generations", json=body)
                                      for i in range(count)))
    finally:
        for client in clients:
            await client.aclose()


def test_concurrent_requests_through_two_apis_never_overrun_the_spend_budget(platform):
    tenant_id, secret = platform.tenant()
    revision = platform.view.refresh().revisions[platform.model_revision]
    input_tokens = TokenCounter().count(revision.model_path, PROMPT)
    cost = (math.ceil(input_tokens * revision.price_input_per_1k_micros / 1000)
            + math.ceil(OUTPUT_TOKENS * revision.price_output_per_1k_micros / 1000))
    budget = FITS * cost
    admin.set_limits(platform.view, tenant_id=tenant_id, actor="tests", spend_per_window_micros=budget,
                     window_seconds=3600)
    with platform.api_replica() as second_api:
        responses = asyncio.run(_send_all([platform.base_url, second_api], secret, REQUESTS))
    platform.check()

    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert all(r.json()["usage"]["output_tokens"] == OUTPUT_TOKENS for r in ok)
    assert all(r.status_code == 429 and r.json()["error"]["code"] == "spend" for r in refused), \
        {r.status_code: r.text for r in refused}
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
    assert len(ok) == FITS, "settlement charges exactly what was reserved, so exactly the budget's worth fits"

    # The ledger, read in its order: reservations held plus spend settled never exceed the budget.
    def settled():
        events = tenant_ledger(platform.admin_log, tenant_id)
        return events if sum(e.event_type == "UsageSettled" for e in events) == len(ok) else None

    events = wait_until(settled, 60, what="every admitted request to settle")
    held, spent, peak = {}, 0, 0
    for env in events:
        p = env.payload
        if env.event_type == "BudgetReserved":
            held[p.request_id] = p.cost_micros
        elif env.event_type == "UsageSettled":
            held.pop(p.request_id)
            spent += p.cost_micros
        peak = max(peak, spent + sum(held.values()))
    assert peak <= budget and spent <= budget
    assert sum(e.event_type == "BudgetReserved" for e in events) == FITS
    assert sum(e.event_type == "GenerationRejected" and e.payload.reason == "spend" for e in events) == REQUESTS - FITS
    assert not held, "every reservation settled"


def test_limits_changed_at_runtime_apply_to_the_next_request(platform):
    tenant_id, secret = platform.tenant()
    body = {"model_alias": MODEL_ALIAS, "input": PROMPT, "max_output_tokens": 4, "stream": False, "ignore_eos": True}
    with platform.client(secret) as client:
        assert client.post("/v1/generations", json=body).status_code == 200
        admin.set_limits(platform.view, tenant_id=tenant_id, actor="tests", max_output_tokens=3)
        refused = client.post("/v1/generations", json=body)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "output_too_large"
        admin.set_limits(platform.view, tenant_id=tenant_id, actor="tests", max_output_tokens=None,
                         requests_per_minute=1)
        # One admitted in this minute already; the limit counts it.
        limited = client.post("/v1/generations", json=body)
        assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate"
        assert 1 <= int(limited.headers["retry-after"]) <= 60


def test_a_deadline_that_cannot_be_met_is_refused_before_it_queues(platform):
    tenant_id, secret = platform.tenant()
    served_before = platform.worker.served
    body = {"model_alias": MODEL_ALIAS, "input": PROMPT, "max_output_tokens": 200, "deadline_ms": 1,
            "stream": False}
    with platform.client(secret) as client:
        refused = client.post("/v1/generations", json=body)
    assert refused.status_code in (400, 429, 504) and refused.json()["error"]["code"] == "deadline", refused.text
    events = tenant_ledger(platform.admin_log, tenant_id)
    assert [e.event_type for e in events] == ["GenerationRejected"]
    assert platform.worker.served == served_before
