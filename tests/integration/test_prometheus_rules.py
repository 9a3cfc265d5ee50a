"""The Prometheus rules in infra/: promtool (from Debian's `prometheus` package, which
`infra/services.sh up` installs) checks them and runs their unit tests
(infra/prometheus/rules_test.yml), checks the compose scrape configuration that loads them,
and the local Prometheus of `infra/services.sh` serves with every one of them loaded.
Missing promtool or Prometheus fails the test: these exist to run against the real thing."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.helpers import ROOT

RULES = ROOT / "infra" / "prometheus" / "rules.yml"
RULES_TEST = ROOT / "infra" / "prometheus" / "rules_test.yml"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run `infra/services.sh up prometheus` (Debian's prometheus "
                    f"package brings prometheus and promtool)", pytrace=False)
    return path


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=120)


def rule_names(path: Path) -> set[str]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return {rule.get("record") or rule["alert"] for group in groups for rule in group["rules"]}


def test_promtool_checks_the_rules_and_their_unit_tests_pass():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rule_names(RULES))} rules found" in checked.stdout
    tested = promtool("test", "rules", str(RULES_TEST))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_and_recorded_series_has_a_unit_test():
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    tested = {t["alertname"] for case in tests for t in case.get("alert_rule_test", [])}
    exprs = " ".join(t["expr"] for case in tests for t in case.get("promql_expr_test", []))
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    records = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    assert alerts <= tested, f"alerts without a test: {alerts - tested}"
    # A recorded series an alert reads is tested through the alert.
    read_by_alerts = " ".join(r["expr"] for g in groups for r in g["rules"] if "alert" in r)
    untested = {r for r in records if r not in exprs and r not in read_by_alerts}
    assert not untested, f"recorded series nothing tests: {untested}"


def test_the_compose_scrape_configuration_loads_the_rules(tmp_path):
    config = (ROOT / "infra" / "prometheus.yml").read_text()
    assert "/etc/prometheus/rules.yml" in config
    local = tmp_path / "prometheus.yml"
    local.write_text(config.replace("/etc/prometheus/rules.yml", str(RULES)))
    checked = promtool("check", "config", str(local))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_local_prometheus_serves_with_the_rules_loaded(prometheus_url):
    url = prometheus_url
    assert httpx.get(f"{url}/-/ready", timeout=10).status_code == 200
    groups = httpx.get(f"{url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    loaded = {rule["name"] for group in groups if group["file"] == str(RULES) for rule in group["rules"]}
    assert loaded == rule_names(RULES), ("the local Prometheus runs other rules than infra/prometheus/rules.yml: "
                                         "`infra/prometheus.sh up` reads them again")
