"""A router alias over HTTP, both logs: static rules by tag and tenant, a dynamic rule that
the eval table steers (the cheapest revision clearing the bar for the prompt's difficulty),
and the overload ladder: with the routed revision's workers gone, a request is served by
the router's smaller fallback, charged at its price once; the revision cools down, so the
next goes there at once; a budget refusal is never retried on a fallback."""
from __future__ import annotations

from tests.fleet_pool import pool_of
from tests.helpers import wait_until


def status(client, request_id: str) -> dict:
    def settled():
        s = client.get(f"/v1/generations/{request_id}").json()
        return s if s["usage"]["settled"] else None
    return wait_until(settled, 30, what=f"{request_id} settled")


def test_a_router_chooses_by_rule_and_eval_table_and_falls_back_to_a_smaller_revision_under_overload(platform):
    _, operator = platform.tenant(scopes=("admin",))
    _, secret = platform.tenant()
    other_id, other_secret = platform.tenant()
    _, poor_secret = platform.tenant(spend_per_window_micros=1)
    svc = platform.app.state.services
    with pool_of(platform, workers=1, pause_s=0.002, name="small", price_output_per_1k_micros=1000) as small, \
            platform.client(operator) as ops, platform.client(secret) as client:

        def generate(c, text: str = "hi", **headers):
            r = c.post("/v1/generations", headers=headers, json={
                "model_alias": alias, "input": text, "max_output_tokens": 2, "ignore_eos": True, "stream": False})
            return r

        def served(c, text: str = "hi", **headers) -> tuple[str, str | None]:
            r = generate(c, text, **headers)
            assert r.status_code == 200, r.text
            assert r.headers["X-Model-Revision"] == r.json()["model_revision"]
            return r.json()["model_revision"], r.headers.get("X-Routed-By")

        with pool_of(platform, workers=1, pause_s=0.002, name="big") as big:
            alias = big.alias
            rules = [{"name": "tagged", "tag": "cheap", "revision": small.revision},
                     {"name": "other-tenant", "tenant": other_id, "revision": small.revision},
                     {"name": "smart", "task": "qa", "revisions": [small.revision, big.revision], "bar": 0.8,
                      "hard_input_tokens": 30}]
            bad = ops.put(f"/v1/admin/routers/{alias}", json={"rules": [{"name": "x", "revision": "nope@1"}]})
            assert bad.status_code == 404, bad.text
            set_ = ops.put(f"/v1/admin/routers/{alias}", json={"rules": rules, "fallbacks": [small.revision]})
            assert set_.status_code == 200 and [r["name"] for r in set_.json()["rules"]] == ["tagged", "other-tenant",
                                                                                               "smart"], set_.text
            assert served(client) == (big.revision, "default"), "no eval data: the dynamic rule stays out"
            assert served(client, **{"X-Route-Tag": "cheap"}) == (small.revision, "tagged")
            with platform.client(other_secret) as other:
                assert served(other) == (small.revision, "other-tenant")

            uploaded = ops.post("/v1/admin/evals", json={"source": "run-1", "rows": [
                {"task": "qa/easy", "model_revision": small.revision, "score": 0.9},
                {"task": "qa/easy", "model_revision": big.revision, "score": 0.95},
                {"task": "qa/hard", "model_revision": small.revision, "score": 0.3},
                {"task": "qa/hard", "model_revision": big.revision, "score": 0.9}]})
            assert uploaded.status_code == 201, uploaded.text
            assert served(client) == (small.revision, "smart"), "easy: the cheapest that clears the bar"
            long_prompt = " ".join(["word"] * 60)
            assert served(client, long_prompt) == (big.revision, "smart"), "hard: only the big one clears it"
            ops.post("/v1/admin/evals", json={"source": "run-2", "rows": [
                {"task": "qa/easy", "model_revision": small.revision, "score": 0.5}]})
            r = generate(client)
            assert r.json()["model_revision"] == big.revision and r.headers["X-Routed-By"] == "smart"
            routed = status(client, r.json()["id"])
            assert routed["route"] == {"rule": "smart", "fallback_from": None}

        # The big revision's worker is gone: the ladder downgrades to the small one.
        wait_until(lambda: not svc.fleet.serves_soon("interactive", big.revision), 30,
                   what="the fleet view to lose the big revision's worker")
        r = generate(client)
        assert r.status_code == 200, r.text
        assert r.headers["X-Fallback-From"] == big.revision and r.headers["X-Routed-By"] == "fallback"
        body = r.json()
        assert body["model_revision"] == small.revision
        fell = status(client, body["id"])
        assert fell["model_revision"] == small.revision and fell["route"] == {"rule": "fallback",
                                                                              "fallback_from": big.revision}
        usage = fell["usage"]
        assert usage["cost_micros"] == usage["input_tokens"] + 2, "charged once, at the small revision's price"
        ladder = ops.get(f"/v1/admin/routers/{alias}").json()["ladder"]
        assert big.revision in ladder["cooling"] and ladder["fallbacks_taken"][small.revision] >= 1, ladder
        again = generate(client)
        assert again.status_code == 200 and again.headers["X-Fallback-From"] == big.revision
        assert again.json()["model_revision"] == small.revision

        with platform.client(poor_secret) as poor:
            refused = generate(poor)
        assert refused.status_code in (400, 429) and refused.json()["error"]["code"] == "spend", refused.text

        assert ops.delete(f"/v1/admin/routers/{alias}").status_code == 200
        plain = generate(client)
        assert plain.status_code == 503 and plain.json()["error"]["code"] == "no_capacity", "no router: no ladder"


def test_routing_decisions_and_cache_hits_replay_the_same(platform, tmp_path):
    """The platform's log, projected live and replayed into another database, gives the
    same rows for routed, fallen-back and cached generations: which rule chose which
    revision, and which cache entry answered, are on the log, not in an API's memory."""
    import hashlib

    import sqlalchemy as sa

    from migrations.runner import upgrade
    from models.events import canonical
    from models.tables import generations, usage_ledger
    from pipelines.audit.replay import replay
    from pipelines.projections.sql import open_projection_db
    from tests.integration.conftest_ledger import EVERY, SIGNER, project

    _, operator = platform.tenant(scopes=("admin",))
    tenant_id, secret = platform.tenant()
    with pool_of(platform, workers=1, pause_s=0.002, name="replay") as own, platform.client(operator) as ops, \
            platform.client(secret) as client:
        assert ops.put(f"/v1/admin/routers/{own.alias}", json={"rules": [
            {"name": "tagged", "tag": "shared", "revision": platform.model_revision}]}).status_code == 200
        assert ops.put(f"/v1/admin/tenants/{tenant_id}/cache/{own.alias}", json={}).status_code == 200
        ids = {}
        for name, headers in (("tagged", {"X-Route-Tag": "shared"}), ("default", {}), ("cached", {})):
            r = client.post("/v1/generations", headers=headers, json={
                "model_alias": own.alias, "input": "Name a river in Egypt.", "max_output_tokens": 2,
                "temperature": 0, "ignore_eos": True, "stream": False})
            assert r.status_code == 200, r.text
            ids[name] = r.json()["id"]
            status(client, ids[name])
    live_url = f"sqlite:///{tmp_path / 'live.db'}"
    upgrade(live_url)
    replayed_url = f"sqlite:///{tmp_path / 'replayed.db'}"
    with platform.open_log() as log:
        project(log, live_url)
        replay(log, replayed_url, SIGNER, checkpoint_every=EVERY)

    def ours(url: str) -> tuple[dict, str]:
        engine = open_projection_db(url)
        try:
            with engine.connect() as conn:
                rows = {r.request_id: r._mapping for r in conn.execute(
                    sa.select(generations).where(generations.c.tenant_id == tenant_id))}
                usage = [tuple(r) for r in conn.execute(sa.select(usage_ledger).where(
                    usage_ledger.c.tenant_id == tenant_id).order_by(usage_ledger.c.source_id))]
            digest = hashlib.sha256(canonical([[str(v) for v in rows[k].values()] for k in sorted(rows)])
                                    + canonical([[str(v) for v in u] for u in usage])).hexdigest()
            return {k: dict(v) for k, v in rows.items()}, digest
        finally:
            engine.dispose()

    live, live_digest = ours(live_url)
    again, replayed_digest = ours(replayed_url)
    assert replayed_digest == live_digest
    assert (live[ids["tagged"]]["route_rule"], live[ids["tagged"]]["model_revision"]) == ("tagged",
                                                                                          platform.model_revision)
    assert (live[ids["default"]]["route_rule"], live[ids["default"]]["model_revision"]) == ("default", own.revision)
    assert live[ids["default"]]["cache_entry_id"] is None and live[ids["cached"]]["cache_entry_id"] is not None
    assert again[ids["cached"]]["cache_entry_id"] == live[ids["cached"]]["cache_entry_id"]
