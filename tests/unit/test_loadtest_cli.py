"""`ledgerlm loadtest` as a user starts it: a short sweep (`--steps`, `--duration`) said
before it starts, keys from the environment or the load test's own tenants made with the
admin token (made once, reused after, a fresh key each time), and a one-line refusal with
exit status 2 when neither is there. The admin API is an in-process stand-in here; the
platform's own is in tests/e2e/test_loadtest.py."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from api.cli.main import main
from api.loadtest import WorkloadError, load, parse
from api.loadtest.tenants import provide_keys, tenant_id_for
from api.loadtest.workload import missing_keys

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "tests" / "perf" / "loadtest_workload.yaml"
KEY_VARIABLES = ("LOADTEST_KEY_INTERACTIVE", "LOADTEST_KEY_BACKGROUND", "LEDGERLM_BOOTSTRAP_TOKEN")


@pytest.fixture
def no_keys(monkeypatch):
    for name in KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


class FakeAdmin:
    """The platform's admin routes for tenants and keys, with its answers: 201 for a new
    tenant, 409 for one that exists, 401 for another token."""

    def __init__(self, token: str = "admin-token"):
        self.token, self.tenants, self.keys, self.calls = token, set(), {}, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.method, request.url.path))
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return httpx.Response(401, json={"error": {"message": "Invalid credentials", "code": "invalid_api_key"}})
        body = json.loads(request.content)
        if request.url.path == "/v1/admin/tenants":
            if body["tenant_id"] in self.tenants:
                return httpx.Response(409, json={"error": {"message": "exists", "code": "conflict"}})
            self.tenants.add(body["tenant_id"])
            return httpx.Response(201, json={"tenant_id": body["tenant_id"]})
        tenant_id = request.url.path.split("/")[4]
        if tenant_id not in self.tenants:
            return httpx.Response(404, json={"error": {"message": "no such tenant", "code": "not_found"}})
        key = f"key-{tenant_id}-{len(self.keys)}"
        self.keys[key] = (tenant_id, body["scopes"])
        return httpx.Response(201, json={"api_key": key, "tenant_id": tenant_id})


@pytest.fixture
def admin(monkeypatch):
    """The stand-in behind every httpx.Client the tenants module opens."""
    fake = FakeAdmin()
    real = httpx.Client
    monkeypatch.setattr("api.loadtest.tenants.httpx.Client",
                        lambda **kw: real(transport=httpx.MockTransport(fake), **kw))
    return fake


def test_unset_key_variables_are_listed_not_refused_when_allowed(no_keys, monkeypatch):
    with pytest.raises(WorkloadError, match=r"\$LOADTEST_KEY_INTERACTIVE is not set"):
        load(SHIPPED)
    monkeypatch.setenv("LOADTEST_KEY_BACKGROUND", "k-bg")
    workload = load(SHIPPED, allow_missing_keys=True)
    assert [t.name for t in missing_keys(workload)] == ["interactive"]
    assert {t.name: t.api_key for t in workload.tenants} == {"interactive": None, "background": "k-bg"}


def test_tenants_are_made_once_and_reused_with_a_fresh_key_each_time(no_keys, admin):
    workload = load(SHIPPED, allow_missing_keys=True)
    made = provide_keys(workload, missing_keys(workload), "http://platform:8000/v1", "admin-token")
    assert [(m.name, m.tenant_id, m.created) for m in made] == [
        ("interactive", "loadtest-interactive", True), ("background", "loadtest-background", True)]
    first = {t.name: t.api_key for t in workload.tenants}
    assert admin.keys[first["interactive"]] == ("loadtest-interactive", ["generate"])
    again = load(SHIPPED, allow_missing_keys=True)
    made = provide_keys(again, again.tenants, "http://platform:8000", "admin-token")
    assert [m.created for m in made] == [False, False]  # the tenants exist: reused
    second = {t.name: t.api_key for t in again.tenants}
    assert set(second.values()).isdisjoint(first.values()) and None not in second.values()
    assert admin.tenants == {"loadtest-interactive", "loadtest-background"}
    assert ("POST", "/v1/admin/tenants/loadtest-background/keys") in admin.calls


def test_a_wrong_token_or_an_impossible_id_is_a_clear_error(no_keys, admin):
    workload = load(SHIPPED, allow_missing_keys=True)
    with pytest.raises(WorkloadError, match=r"making tenant 'loadtest-interactive': HTTP 401: Invalid credentials "
                                            r"\(is the admin token the platform's LEDGERLM_BOOTSTRAP_TOKEN\?\)"):
        provide_keys(workload, workload.tenants, "http://platform", "wrong")
    assert tenant_id_for("Team A/prod") == "loadtest-team-a-prod"
    with pytest.raises(WorkloadError, match="cannot be a platform tenant id"):
        tenant_id_for("x" * 70)


def test_missing_keys_without_a_token_is_one_line_and_status_2(no_keys, capsys):
    code, out, err = run(capsys, "loadtest", str(SHIPPED), "--target", "http://127.0.0.1:9", "--no-progress")
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("ledgerlm loadtest: error: no API key for tenants interactive, background")
    assert "set $LOADTEST_KEY_INTERACTIVE, $LOADTEST_KEY_BACKGROUND, or set LEDGERLM_BOOTSTRAP_TOKEN" in err
    code, _, err = run(capsys, "loadtest", str(SHIPPED), "--target", "http://127.0.0.1:9", "--make-tenants")
    assert code == 2 and "--make-tenants needs the platform admin's token: set LEDGERLM_BOOTSTRAP_TOKEN" in err


def test_an_unreachable_admin_api_is_one_line_and_status_2(no_keys, capsys, monkeypatch):
    monkeypatch.setenv("LEDGERLM_BOOTSTRAP_TOKEN", "admin-token")
    code, out, err = run(capsys, "loadtest", str(SHIPPED), "--target", "http://127.0.0.1:9", "--no-progress")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "cannot reach the platform's admin API at http://127.0.0.1:9/v1/admin" in err


def test_a_missing_workload_file_is_one_line_and_status_2(capsys, tmp_path):
    code, _, err = run(capsys, "loadtest", str(tmp_path / "absent.yaml"), "--target", "http://x")
    assert code == 2 and err.startswith("ledgerlm loadtest: error: cannot read the workload")


def parsed(*argv: str):
    import argparse

    from api.cli.loadtest import register
    from api.cli.main import build_parser

    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    register(verbs)
    return parser.parse_args(["loadtest", "w.yaml", "--target", "http://x", *argv])


def test_steps_and_duration_make_a_short_sweep_said_before_it_starts():
    from api.cli.loadtest import apply_options, plan_line

    workload = parse(yaml.safe_load(SHIPPED.read_text()) | {"tenants": [{"name": "a", "api_key": "k"}]})
    apply_options(workload, parsed("--steps", "4", "--duration", "5"))
    assert workload.mode.rates == [2, 4, 8, 16] and workload.mode.duration_s == 5
    assert plan_line(workload, "http://x") == \
        "ledgerlm loadtest: 4 steps of 5 s each (2, 4, 8, 16 requests/s) against http://x"
    one = parse({"mode": {"kind": "concurrency", "concurrency": 3, "duration_s": 2.5}})
    assert plan_line(one, "http://x") == "ledgerlm loadtest: 1 step of 2.5 s each (3 concurrent) against http://x"
    with pytest.raises(WorkloadError, match="--steps applies to a sweep"):
        apply_options(one, parsed("--steps", "2"))
    for bad in (["--steps", "0"], ["--duration", "-5"], ["--duration", "soon"]):
        with pytest.raises(SystemExit):
            parsed(*bad)


def test_the_help_says_what_duration_steps_and_make_tenants_do(capsys):
    code, out, _ = run(capsys, "loadtest", "--help")
    text = " ".join(out.split())
    assert code == 0
    assert "--duration SECONDS seconds each step sends for" in text and "a sweep of N steps takes about N times" in text
    assert "--steps N run only the sweep's first N steps" in text
    assert "--make-tenants make the load test's own tenants" in text and "LEDGERLM_BOOTSTRAP_TOKEN" in text


def test_the_table_and_the_csv_number_steps_from_1(tmp_path):
    from api.cli.loadtest import summary
    from api.loadtest import report

    latency = {"p50": 1.0, "p95": 2.0, "p99": 3.0}
    steps = [{"step": n, "mode": "rate", "rate": float(r), "concurrency": None, "duration_s": 5.0, "requests": 10,
              "served": 10, "requests_per_s": 2.0, "output_tokens_per_s": 40.0 * n, "goodput_requests_per_s": 2.0,
              "goodput_output_tokens_per_s": 40.0 * n, "meets_slo": n < 3, "ttft_ms": latency, "tpot_ms": latency,
              "itl_ms": latency, "e2e_ms": latency, "rejections": {}, "failures": 0, "client_cpu_ms_per_request": 1.0,
              "per_tenant": {}} for n, r in ((1, 2), (2, 4), (3, 8))]
    knee, why = report.find_knee(steps, 0.05)
    result = {"target": "t", "steps": steps, "knee": knee, "knee_reason": why, "slo": {}}
    lines = summary(result).splitlines()
    assert lines[0] == "t: knee at step 2 (slo broken at step 3)"
    assert [line.split()[:2] for line in lines[2:]] == [["1", "2.0/s"], ["2", "4.0/s"], ["3", "8.0/s"]]
    report.write(result, tmp_path, stem="r")
    rows = (tmp_path / "r.csv").read_text().splitlines()[1:]
    assert [row.split(",")[0] for row in rows] == ["1", "2", "3"]
