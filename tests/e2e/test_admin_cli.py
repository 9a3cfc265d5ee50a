"""`ledgerlm admin ...` on the embedded log: each verb appends an admin event and prints JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
    assert lines(approved) == [{"alias": "tiny", "model_revision": "tiny@abc"}]
    assert lines(ledgerlm(tmp_path, "model", "alias", "tiny-acme", "tiny@abc", "--tenants", "acme")) == [
        {"alias": "tiny-acme", "model_revision": "tiny@abc"}]

    for bad in (["limits", "set", "nobody", "--max-concurrent", "1"], ["tenant", "create", "acme"],
                ["model", "alias", "x", "no-such-revision"]):
        result = ledgerlm(tmp_path, *bad)
        assert result.returncode == 2 and result.stderr.startswith("error:"), (bad, result.stderr)
