"""The web console over HTTP: sign-in and its session, a tenant admin kept to its tenant on
every page and export, totals equal to the ledger to the micro-unit, key actions as admin
events, pagination, and each page one response with no script."""
from __future__ import annotations

import csv
import io
import re

import pyarrow.parquet as pq

from models import topics
from models.events import decode
from tests.e2e.console_fixture import GENERATIONS_A, csrf_of

PAGES = ("/console/usage", "/console/usage?group=key", "/console/usage?group=revision", "/console/usage?group=day",
         "/console/limits", "/console/generations", "/console/batches", "/console/keys", "/console/audit",
         "/console/routing")
OPERATOR_PAGES = ("/console/fleet", "/console/rollouts")


def test_pages_ask_for_a_sign_in_and_refuse_keys_that_may_not(console_platform):
    cp = console_platform
    with cp.browser_client() as browser:
        first = browser.get("/console/usage")
        assert first.status_code == 303 and first.headers["location"] == "/console/login"
        assert browser.get("/console/login").status_code == 200
        wrong = browser.post("/console/login", data={"api_key": "llm-not-a-key"})
        assert wrong.status_code == 401 and "Incorrect, revoked or expired" in wrong.text
        plain = browser.post("/console/login", data={"api_key": cp.tenants["a"].chat})
        assert plain.status_code == 401 and "tenant_admin" in plain.text
        assert "ledgerlm_console" not in browser.cookies
    with cp.browser_client() as forger:
        forger.cookies.set("ledgerlm_console", "abc.def")
        assert forger.get("/console/usage").status_code == 303
    with cp.browser_client() as browser:
        other_site = browser.post("/console/login", data={"api_key": cp.tenants["a"].admin},
                                  headers={"Origin": "https://elsewhere.example"})
        assert other_site.status_code == 403


def test_the_session_cookie_is_opaque_http_only_and_strict_and_sign_out_ends_it(console_platform):
    cp = console_platform
    secret = cp.tenants["a"].admin
    with cp.browser_client() as browser:
        signed = browser.post("/console/login", data={"api_key": secret})
        assert signed.status_code == 303 and signed.headers["location"] == "/console/usage"
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert secret not in cookie and secret[8:24] not in cookie
        value = browser.cookies["ledgerlm_console"]
        usage = browser.get("/console/usage")
        assert usage.status_code == 200
        assert browser.post("/console/logout", data={"csrf": csrf_of(usage.text)}).status_code == 303
    with cp.browser_client() as replayed:
        replayed.cookies.set("ledgerlm_console", value)
        assert replayed.get("/console/usage").status_code == 303


def _tenant_ids_and_requests(cp, tag):
    t = cp.tenants[tag]
    return [t.tenant_id, *t.request_ids]


def test_a_tenant_admin_sees_its_tenant_only_on_every_page_and_export(console_platform):
    cp = console_platform
    a, b = cp.tenants["a"], cp.tenants["b"]
    with cp.signed_in(a.admin) as browser:
        for path in PAGES:
            shown = browser.get(path)
            assert shown.status_code == 200, (path, shown.text[:300])
            assert a.tenant_id in shown.text, path
            leaked = [x for x in _tenant_ids_and_requests(cp, "b") if x in shown.text]
            assert not leaked, f"{path} shows tenant b's {leaked}"
            other = browser.get(path + ("&" if "?" in path else "?") + f"tenant={b.tenant_id}")
            assert other.status_code == 404 and b.tenant_id not in other.text, path
        for path in OPERATOR_PAGES:
            assert browser.get(path).status_code == 404, path
        assert browser.get(f"/console/batches/{b.tenant_id}/batch_x").status_code == 404
        assert browser.get(f"/console/usage/export?format=csv&tenant={b.tenant_id}").status_code == 404
        exported = browser.get("/console/usage/export?format=csv")
        assert exported.status_code == 200
        rows = list(csv.DictReader(io.StringIO(exported.text)))
        assert rows and {r["tenant_id"] for r in rows} == {a.tenant_id}
        # Every row says how many output tokens reached the client and whether the cache answered.
        assert all(r["delivered_output_tokens"].isdigit() and int(r["delivered_output_tokens"]) <= int(r["output_tokens"])
                   and r["cached"] in ("true", "false") for r in rows), rows[:3]
        generations = browser.get("/console/generations?limit=200").text
        assert set(re.findall(r'data-tenant="([^"]+)"', generations)) == {a.tenant_id}


def test_an_operator_sees_every_tenant(console_platform):
    cp = console_platform
    with cp.signed_in(cp.operator) as browser:
        usage = browser.get("/console/usage")
        assert usage.status_code == 200
        keys = set(re.findall(r'class="usage-row" data-key="([^"]+)"', usage.text))
        assert {cp.tenants["a"].tenant_id, cp.tenants["b"].tenant_id} <= keys
        for path in (*PAGES, *OPERATOR_PAGES):
            assert browser.get(path).status_code == 200, path
        assert "test-worker-" in browser.get("/console/fleet").text
        assert browser.get("/console/keys?tenant=nobody").status_code == 404


def _micros(html: str, element_id: str) -> int:
    found = re.search(rf'id="{element_id}" data-micros="(-?\d+)"', html)
    assert found, f"no {element_id} on the page"
    return int(found.group(1))


def test_console_totals_equal_the_ledger_to_the_micro_unit(console_platform):
    """Reconciliation: the usage page (from the daily rollup), its rows per group, and both
    exports (from the ledger rows) all equal the ledger's own sum."""
    cp = console_platform
    with cp.signed_in(cp.operator) as browser:
        for tag in ("a", "b"):
            tenant_id = cp.tenants[tag].tenant_id
            ledger = cp.ledger_micros(tenant_id)
            assert ledger > 0
            page = browser.get(f"/console/usage?tenant={tenant_id}&group=key").text
            assert _micros(page, "total-cost") == ledger
            rows = [int(m) for m in re.findall(r'class="usage-row".*?data-micros="(-?\d+)"', page, re.S)]
            assert sum(rows) == ledger and len(rows) == 2, "two keys sent traffic"
            assert re.search(r'id="total-generations">(\d+)<', page).group(1) == str(len(cp.tenants[tag].request_ids))
            exported = browser.get(f"/console/usage/export?format=csv&tenant={tenant_id}&start=2000-01-01")
            assert sum(int(r["cost_micros"]) for r in csv.DictReader(io.StringIO(exported.text))) == ledger
            parquet = browser.get(f"/console/usage/export?format=parquet&tenant={tenant_id}&start=2000-01-01")
            assert parquet.status_code == 200
            table = pq.read_table(io.BytesIO(parquet.content))
            assert sum(table.column("cost_micros").to_pylist()) == ledger
            assert set(table.column("tenant_id").to_pylist()) == {tenant_id}
        everything = browser.get("/console/usage").text
        assert _micros(everything, "total-cost") == cp.ledger_micros()


def test_generations_page_newest_first_with_no_row_twice(console_platform):
    cp = console_platform
    a = cp.tenants["a"]
    with cp.signed_in(a.admin) as browser:
        first = browser.get("/console/generations?limit=10").text
        ids = re.findall(r'data-request-id="([^"]+)"', first)
        assert len(ids) == 10
        older = re.search(r'href="([^"]+)" id="next-page"', first)
        assert older, "a second page is linked"
        second = browser.get("/console/generations" + older.group(1).replace("&amp;", "&")).text
        more = re.findall(r'data-request-id="([^"]+)"', second)
        assert len(more) == GENERATIONS_A - 10 and 'id="next-page"' not in second
        assert sorted(ids + more) == sorted(a.request_ids)
        assert ids[0] == a.request_ids[-1], "the newest first"
        assert browser.get("/console/generations?before=not-a-cursor").status_code == 400


def _admin_events(cp, event_type: str, key_id: str) -> list:
    records = cp.platform.admin_log.read_partition(topics.ADMIN.name, 0)
    return [env for env in map(decode, (r.value for r in records))
            if env.event_type == event_type and env.payload.key_id == key_id]


def test_a_tenant_admin_issues_rotates_expires_and_revokes_keys_as_admin_events(console_platform):
    cp = console_platform
    a, b = cp.tenants["a"], cp.tenants["b"]
    with cp.signed_in(a.admin) as browser:
        page = browser.get("/console/keys")
        csrf = csrf_of(page.text)
        form = {"csrf": csrf, "tenant": a.tenant_id, "application_id": "reports", "scope_generate": "on"}
        assert browser.post("/console/keys/issue", data={**form, "csrf": "wrong"}).status_code == 403
        refused = browser.post("/console/keys/issue", data={**form, "scope_operator": "on"})
        assert refused.status_code == 403, "a tenant admin may not issue an operator key"
        assert browser.post("/console/keys/issue", data={**form, "tenant": b.tenant_id}).status_code == 404
        issued = browser.post("/console/keys/issue", data=form)
        assert issued.status_code == 303
        shown = browser.get(issued.headers["location"]).text
        key_id, secret = re.search(r'<pre id="new-secret" data-key-id="([^"]+)">([^<]+)</pre>', shown).groups()
        assert secret not in browser.get("/console/keys").text, "a secret is shown once"
        event = _admin_events(cp, "ApiKeyIssued", key_id)[0]
        assert event.payload.actor.startswith(a.tenant_id + "/") and event.payload.application_id == "reports"
        with cp.platform.client(secret) as client:
            assert client.get("/v1/models").status_code == 200
            rotated = browser.post(f"/console/keys/{key_id}/rotate", data={"csrf": csrf, "old_key_valid_for_s": "0"})
            assert rotated.status_code == 303
            new_secret = re.search(r'<pre id="new-secret"[^>]*>([^<]+)</pre>',
                                   browser.get("/console/keys").text).group(1)
            assert client.get("/v1/models").status_code == 401, "rotated with no overlap"
        with cp.platform.client(new_secret) as client:
            new_id = next(k for k in re.findall(r'data-key-id="([^"]+)" data-state="active"',
                                                browser.get("/console/keys").text) if k != key_id and
                          _admin_events(cp, "ApiKeyIssued", k) and _admin_events(cp, "ApiKeyIssued", k)[0]
                          .payload.rotated_from == key_id)
            assert client.get("/v1/models").status_code == 200
            assert browser.post(f"/console/keys/{new_id}/revoke", data={"csrf": csrf}).status_code == 303
            assert client.get("/v1/models").status_code == 401
        assert _admin_events(cp, "ApiKeyRevoked", new_id)
        expiring = browser.post("/console/keys/issue", data=form)
        exp_id = re.search(r'data-key-id="([^"]+)">', browser.get(expiring.headers["location"]).text).group(1)
        assert browser.post(f"/console/keys/{exp_id}/expire", data={"csrf": csrf}).status_code == 303
        assert _admin_events(cp, "ApiKeyExpirySet", exp_id)
        assert 'data-key-id="%s" data-state="expired"' % exp_id in browser.get("/console/keys").text
        with cp.signed_in(b.admin) as other:
            b_key = re.search(r'data-key-id="([^"]+)"', other.get("/console/keys").text).group(1)
        assert browser.post(f"/console/keys/{b_key}/revoke", data={"csrf": csrf}).status_code == 404


def test_limits_show_what_admission_enforces_and_never_unlimited(console_platform):
    cp = console_platform
    b = cp.tenants["b"]
    with cp.signed_in(b.admin) as browser:
        unset = browser.get("/console/limits").text
        assert "unlimited" not in unset.lower()
        assert "bounded by the model&#39;s context" in unset or "bounded by the model's context" in unset
    from pipelines.admin import commands as admin
    from pipelines.admin import tenants as admin_tenants
    admin.set_limits(cp.platform.view, tenant_id=b.tenant_id, actor="tests", tokens_per_window=100_000,
                     max_output_tokens=64, spend_per_window_micros=5_000_000)
    admin_tenants.set_own_limits(cp.platform.view, tenant_id=b.tenant_id, actor="tests", max_output_tokens=32)
    with cp.signed_in(b.admin) as browser:
        shown = browser.get("/console/limits").text
        row = re.search(r'data-limit="max_output_tokens">(.*?)</tr>', shown, re.S).group(1)
        assert re.search(r'class="num in-force">32<', row), "the grant tightened by the tenant's own"
        tokens = re.search(r'data-limit="tokens_per_window">(.*?)</tr>', shown, re.S).group(1)
        used = int(re.findall(r'class="num">([\d,]+)<', tokens)[-1].replace(",", ""))
        assert used > 0 and f'class="num remaining">{100_000 - used:,}<' in tokens
        assert "5.000000" in shown


def test_audit_verification_runs_and_says_ok(console_platform):
    cp = console_platform
    cp.project()
    with cp.signed_in(cp.operator) as browser:
        page = browser.get("/console/audit")
        assert "Not verified" in page.text and "MISMATCH" not in page.text
        assert browser.post("/console/audit/verify", data={"csrf": csrf_of(page.text)}).status_code == 303
        result = browser.get("/console/audit").text
        assert re.search(r'id="verify-result">OK:', result), result[:2000]
    with cp.signed_in(cp.tenants["a"].admin) as browser:
        page = browser.get("/console/audit")
        assert 'id="verify-now"' not in page.text
        csrf = csrf_of(page.text)
        assert browser.post("/console/audit/verify", data={"csrf": csrf}).status_code == 404


def test_each_page_is_one_response_with_no_script(console_platform):
    """The '3 requests a page' goal: the page and its stylesheet, nothing fetched per row."""
    cp = console_platform
    with cp.signed_in(cp.operator) as browser:
        for path in (*PAGES, *OPERATOR_PAGES):
            html = browser.get(path).text
            assert "<script" not in html, path
            fetched = re.findall(r'<(?:link|img|iframe)[^>]+(?:href|src)="([^"]+)"', html)
            assert fetched == ["/console/static/console.css"], (path, fetched)
        css = browser.get("/console/static/console.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
