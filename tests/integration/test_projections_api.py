"""`GET /v1/usage` and `GET /v1/audit/events` over real projections: a tenant sees its
own usage and events only, a platform auditor sees all, and no prompt or completion
text ever appears. Keys are real (issued through `pipelines.admin.commands` onto an embedded log
that the API's `RegistryView` reads); the projections are on PostgreSQL and SQLite."""
from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.deps import Services
from api.stream_hub import StreamHub
from models import topics
from models.events import new_event
from models.events_generation import PromptSubmitted, TokensEmitted
from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.admin.commands import RegistryView
from pipelines.projections.queries import generation_status
from pipelines.projections.sql import open_projection_db
from pipelines.publish import publish
from pipelines.generation.tokencount import TokenCounter
from tests.integration.conftest_ledger import project
from tests.ledger_workload import BASE, Workload, append_all

SECRET_TEXT = "TOP-SECRET-PROMPT-TEXT"


@pytest.fixture
def platform(embedded_ledger_log, ledger_dbs, tmp_path):
    log = embedded_ledger_log()
    view = RegistryView(log)
    for tenant in ("acme", "globex", "ops"):
        admin.create_tenant(view, tenant_id=tenant, name=tenant.title(), actor="root")
    keys = {
        "acme": admin.issue_key(view, tenant_id="acme", actor="root", scopes=("generate", "usage"))[0],
        "acme_audit": admin.issue_key(view, tenant_id="acme", actor="root", scopes=("audit",))[0],
        "acme_generate": admin.issue_key(view, tenant_id="acme", actor="root", scopes=("generate",))[0],
        "globex": admin.issue_key(view, tenant_id="globex", actor="root", scopes=("usage", "audit"))[0],
        "platform": admin.issue_key(view, tenant_id="ops", actor="root", scopes=("admin", "audit"))[0],
    }
    admin.set_limits(view, tenant_id="acme", actor="root", tokens_per_window=10_000_000, max_concurrent=50)
    workload = Workload(seed=8, tenants=2)
    workload.tenants = ["acme", "globex"]
    append_all(log, workload.generations(160))
    # Text lives on bounded topics; one prompt is also misrouted onto a durable topic.
    prompt = new_event(PromptSubmitted(request_id="gen_00000001", prompt=SECRET_TEXT), tenant_id="acme",
                       correlation_id="gen_00000001", occurred_at=BASE)
    publish(log, topics.PROMPTS, [prompt])
    publish(log, topics.REQUESTS, [prompt])
    publish(log, topics.STREAM, [new_event(TokensEmitted(request_id="gen_00000001", seq=0, text=SECRET_TEXT,
                                                         token_count=3), tenant_id="acme",
                                           correlation_id="gen_00000001", occurred_at=BASE)])
    url = ledger_dbs.new()
    project(log, url)
    settings = Settings(database_url=url, home=tmp_path, event_log_url=f"sqlite:///{tmp_path / 'eventlog.db'}")
    app = create_app(Services(settings=settings, log=log, registry_view=view, counter=TokenCounter(),
                              hub=StreamHub(log)))
    client = TestClient(app)
    yield client, keys, workload, url
    client.close()
    if getattr(app.state, "projection_db", None) is not None:
        app.state.projection_db.dispose()


def get(client, key, path, **params):
    return client.get(path, params=params, headers={"Authorization": f"Bearer {key}"})


def totals(data) -> dict:
    return {k: sum(row[k] for row in data) for k in ("input_tokens", "output_tokens", "cost_micros")}


def test_each_tenant_sees_its_own_usage_only(platform):
    client, keys, workload, _ = platform
    for tenant in ("acme", "globex"):
        response = get(client, keys[tenant], "/v1/usage")
        assert response.status_code == 200, response.text
        data = response.json()["data"]
        expected = workload.expected.settled[tenant]
        assert totals(data) == {k: expected[k] for k in ("input_tokens", "output_tokens", "cost_micros")}
        assert sum(row["generations"] for row in data) == expected["requests"]
        assert sum(row["batch_chunks"] for row in data) == expected["batch_chunks"]
    assert workload.expected.settled["acme"]["cost_micros"] != workload.expected.settled["globex"]["cost_micros"]


def test_usage_groups_and_date_range(platform):
    client, keys, workload, _ = platform
    by_day = get(client, keys["acme"], "/v1/usage", group_by="day").json()["data"]
    by_model = get(client, keys["acme"], "/v1/usage", group_by="model").json()["data"]
    by_app = get(client, keys["acme"], "/v1/usage", group_by="application").json()["data"]
    assert totals(by_day) == totals(by_model) == totals(by_app)
    assert {row["model_alias"] for row in by_model} == {"tiny", "small"}
    assert {row["application_id"] for row in by_app} >= {"chat", "search"}
    first_day = by_day[0]["day"]
    one_day = get(client, keys["acme"], "/v1/usage", start_date=first_day, end_date=first_day).json()["data"]
    assert one_day == [by_day[0]]
    assert get(client, keys["acme"], "/v1/usage", start_date="2025-03-05", end_date="2025-03-01").status_code == 400
    assert get(client, keys["acme"], "/v1/usage", group_by="week").status_code == 400


def test_usage_needs_a_key_with_the_usage_scope(platform):
    client, keys, _, _ = platform
    assert client.get("/v1/usage").status_code == 401
    assert get(client, "llm-not-a-key", "/v1/usage").status_code == 401
    denied = get(client, keys["acme_generate"], "/v1/usage")
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "insufficient_scope"


def test_quota_shows_the_limits_in_force(platform):
    client, keys, _, _ = platform
    quota = get(client, keys["acme"], "/v1/usage/quota").json()
    assert quota["limits"]["tokens_per_window"] == 10_000_000 and quota["limits"]["max_concurrent"] == 50
    assert quota["reserved"]["concurrent"] == 0 and quota["remaining"]["max_concurrent"] == 50
    assert get(client, keys["globex"], "/v1/usage/quota").json()["limits"]["tokens_per_window"] is None


def all_pages(client, key, **params) -> list[dict]:
    items, after = [], None
    while True:
        page = get(client, key, "/v1/audit/events", limit=37, **params, **({"after": after} if after else {}))
        assert page.status_code == 200, page.text
        body = page.json()
        items += body["data"]
        if not body["has_more"]:
            return items
        after = body["next_cursor"]


def test_a_tenant_auditor_sees_its_own_events_only(platform):
    client, keys, _, _ = platform
    acme = all_pages(client, keys["acme_audit"])
    globex = all_pages(client, keys["globex"])
    assert acme and globex
    assert {e["tenant_id"] for e in acme} == {"acme"} and {e["tenant_id"] for e in globex} == {"globex"}
    positions = [(e["topic"], e["partition"], e["offset"]) for e in acme]
    assert len(positions) == len(set(positions))  # pages neither repeat nor skip
    assert [e["occurred_at"] for e in acme] == sorted(e["occurred_at"] for e in acme)
    assert {e["topic"] for e in acme} <= {t.name for t in topics.DURABLE}
    forbidden = get(client, keys["acme_audit"], "/v1/audit/events", tenant="globex")
    assert forbidden.status_code == 403
    assert get(client, keys["acme"], "/v1/audit/events").status_code == 403  # no audit scope


def test_a_platform_auditor_sees_every_tenant_and_can_narrow(platform):
    client, keys, _, _ = platform
    everything = all_pages(client, keys["platform"])
    assert {"acme", "globex", "ops"} <= {e["tenant_id"] for e in everything}
    only_acme = all_pages(client, keys["platform"], tenant="acme")
    assert only_acme == all_pages(client, keys["acme_audit"])
    settled = all_pages(client, keys["platform"], type="UsageSettled,GenerationRequested")
    assert {e["event_type"] for e in settled} == {"UsageSettled", "GenerationRequested"}
    since = (BASE + timedelta(days=1)).isoformat()
    until = (BASE + timedelta(days=2)).isoformat()
    window = all_pages(client, keys["platform"], since=since, until=until)
    assert window and all(since <= e["occurred_at"].replace("Z", "+00:00") < until for e in window)


def test_audit_items_are_self_checking_and_carry_no_text(platform):
    import hashlib
    import json

    client, keys, _, _ = platform
    response = get(client, keys["platform"], "/v1/audit/events", limit=1000)
    assert SECRET_TEXT not in response.text
    items = response.json()["data"]
    misrouted = [e for e in items if e["event_type"] == "PromptSubmitted"]
    assert misrouted and all(e["event"] is None for e in misrouted)  # chained, but its text never copied
    for item in items:
        if item["event"] is not None:
            raw = json.dumps(item["event"], sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
            assert hashlib.sha256(raw).hexdigest() == item["event_hash"]
    bad = get(client, keys["platform"], "/v1/audit/events", after="not-a-cursor")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "after"


def test_generation_status_is_per_tenant(platform):
    _, _, _, url = platform
    engine = open_projection_db(url)
    try:
        found = {t: generation_status(engine, t, "gen_00000001") for t in ("acme", "globex")}
        owner = next(t for t, status in found.items() if status is not None)
        assert found[owner]["status"] in {"completed", "failed", "cancelled", "expired", "rejected"}
        assert [t for t, status in found.items() if status is None] == [t for t in found if t != owner]
        assert generation_status(engine, owner, "gen_" + uuid.uuid4().hex) is None
    finally:
        engine.dispose()
