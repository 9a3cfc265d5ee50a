"""`ledgerlm admin ...` on the embedded log: each verb appends an admin event and prints JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from models.engine_settings import detect_device, resolve

ROOT = Path(__file__).resolve().parents[2]


def ledgerlm(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LEDGERLM_HOME": str(home), "LEDGERLM_EVENT_LOG_URL": "", "LEDGERLM_EVENT_LOG_NAMESPACE": ""}
    return subprocess.run([sys.executable, "-m", "api.cli", "admin", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def lines(result) -> list[dict]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_admin_cli_manages_tenants_keys_limits_and_models(tmp_path):
    assert lines(ledgerlm(tmp_path, "tenant", "create", "acme", "--name", "Acme")) == [{"tenant_id": "acme"}]
    [limits] = lines(ledgerlm(tmp_path, "limits", "set", "acme", "--requests-per-minute", "60",
                              "--spend-per-window-micros", "5000", "--pool", "gold"))
    assert (limits["requests_per_minute"], limits["spend_per_window_micros"], limits["pool"]) == (60, 5000, "gold")
    [lifted] = lines(ledgerlm(tmp_path, "limits", "set", "acme", "--requests-per-minute", "none"))
    assert lifted["requests_per_minute"] is None and lifted["spend_per_window_micros"] == 5000
    assert lines(ledgerlm(tmp_path, "limits", "show", "acme")) == [lifted]
    [listed] = lines(ledgerlm(tmp_path, "tenant", "list"))
    assert listed["tenant_id"] == "acme" and listed["limits"]["pool"] == "gold"

    [key] = lines(ledgerlm(tmp_path, "key", "issue", "--tenant", "acme", "--scopes", "generate"))
    assert key["api_key"].startswith("llm-")
    assert lines(ledgerlm(tmp_path, "key", "revoke", key["key_id"])) == [{"revoked": key["key_id"]}]

    approved = ledgerlm(tmp_path, "model", "approve", "--alias", "tiny", "--revision", "tiny@abc", "--path", "/m",
                        "--config-hash", "abc", "--max-model-len", "512", "--price-input-per-1k-micros", "1000")
    # "/m" is not a directory here, so no file digests are on record and the answer says so.
    assert lines(approved) == [{"alias": "tiny", "model_revision": "tiny@abc", "artifacts": None,
                                "engine_settings": resolve({}, detect_device()).model_dump()}]  # this host's defaults
    assert lines(ledgerlm(tmp_path, "model", "alias", "tiny-acme", "tiny@abc", "--tenants", "acme")) == [
        {"alias": "tiny-acme", "model_revision": "tiny@abc"}]

    [policy] = lines(ledgerlm(tmp_path, "cache", "set", "acme", "tiny", "--threshold", "0.95",
                              "--price-output-per-1k-micros", "200"))
    assert (policy["enabled"], policy["threshold"], policy["price_output_per_1k_micros"]) == (True, 0.95, 200)
    assert lines(ledgerlm(tmp_path, "cache", "invalidate", "acme", "--alias", "tiny"))[0]["invalidated"]
    [shown] = lines(ledgerlm(tmp_path, "cache", "show", "acme"))
    assert shown["invalidations"] == 1 and shown["ttl_s"] == 3600
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"name": "acme", "tenant": "acme", "revision": "tiny@abc"}]))
    [router] = lines(ledgerlm(tmp_path, "router", "set", "tiny", "--rules", str(rules), "--fallbacks", "tiny@abc"))
    assert [r["name"] for r in router["rules"]] == ["acme"] and router["fallbacks"] == ["tiny@abc"]
    assert lines(ledgerlm(tmp_path, "router", "show", "tiny")) == [router]
    assert lines(ledgerlm(tmp_path, "router", "clear", "tiny")) == [{"alias": "tiny", "cleared": True}]

    for bad in (["limits", "set", "nobody", "--max-concurrent", "1"], ["tenant", "create", "acme"],
                ["model", "alias", "x", "no-such-revision"], ["cache", "set", "acme", "tiny", "--threshold", "0.2"],
                ["router", "show", "tiny"], ["router", "set", "tiny", "--fallbacks", "no-such@1"]):
        result = ledgerlm(tmp_path, *bad)
        assert result.returncode == 2 and result.stderr.startswith("error:"), (bad, result.stderr)


def test_admin_cli_rotates_expires_keys_and_suspends_tenants(tmp_path):
    lines(ledgerlm(tmp_path, "tenant", "create", "acme"))
    [key] = lines(ledgerlm(tmp_path, "key", "issue", "--tenant", "acme", "--scopes", "generate",
                           "--expires-at", "2030-01-01T00:00:00Z"))
    [rotated] = lines(ledgerlm(tmp_path, "key", "rotate", key["key_id"], "--old-valid-for-s", "60"))
    assert rotated["rotated_from"] == key["key_id"] and rotated["api_key"].startswith("llm-")
    assert rotated["old_key_expires_at"] < "2030"
    [expired] = lines(ledgerlm(tmp_path, "key", "expire", rotated["key_id"], "--at", "2031-01-01T00:00:00+00:00"))
    assert expired["expires_at"].startswith("2031-01-01")
    assert ledgerlm(tmp_path, "key", "expire", rotated["key_id"], "--at", "2031-01-01T00:00:00").returncode == 2
    assert lines(ledgerlm(tmp_path, "tenant", "suspend", "acme", "--reason", "unpaid")) == [
        {"tenant_id": "acme", "suspended": True}]
    again = ledgerlm(tmp_path, "tenant", "suspend", "acme")
    assert again.returncode == 2 and "already suspended" in again.stderr
    assert lines(ledgerlm(tmp_path, "tenant", "reinstate", "acme")) == [{"tenant_id": "acme", "suspended": False}]
