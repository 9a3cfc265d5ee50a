"""`ledgerlm admin model list` in-process, and the registry's listing of approved revisions
it shares with `GET /v1/admin/models`."""
from __future__ import annotations

import json

import pytest

import api.cli.main
from models.engine_settings import detect_device, resolve
from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.bootstrap import Bootstrap


@pytest.fixture
def home(tmp_path, monkeypatch):
    for name in ("LEDGERLM_EVENT_LOG_URL", "LEDGERLM_EVENT_LOG_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LEDGERLM_HOME", str(tmp_path))
    return tmp_path


def cli(capsys, *argv: str) -> tuple[int, list[dict], str]:
    code = api.cli.main.main(["admin", "model", *argv])
    out = capsys.readouterr()
    return code, [json.loads(line) for line in out.out.splitlines()], out.err


def test_an_empty_registry_lists_nothing(home, capsys):
    assert cli(capsys, "list") == (0, [], "")


def test_model_list_shows_each_revision_its_aliases_prices_and_whether_it_is_retired(home, capsys):
    with Bootstrap(Settings()).event_log() as log:
        view = admin.RegistryView(log)
        admin.create_tenant(view, tenant_id="acme", name="Acme", actor="ops")
        view.close()
    code, _, err = cli(capsys, "approve", "--alias", "smollm2", "--revision", "smollm2@v1", "--path", "/m/v1",
                       "--config-hash", "aaa", "--max-model-len", "2048", "--price-input-per-1k-micros", "100",
                       "--price-output-per-1k-micros", "400")
    assert code == 0, err
    assert cli(capsys, "approve", "--alias", "smollm2-next", "--revision", "smollm2@v2", "--path", "/m/v2",
               "--config-hash", "bbb", "--max-model-len", "4096", "--price-input-per-1k-micros", "150",
               "--price-output-per-1k-micros", "600")[0] == 0
    assert cli(capsys, "alias", "smollm2-acme", "smollm2@v2", "--tenants", "acme")[0] == 0
    assert cli(capsys, "approve", "--alias", "old", "--revision", "old@1", "--path", "/m/old",
               "--config-hash", "ccc", "--max-model-len", "512")[0] == 0
    assert cli(capsys, "retire", "old@1", "--reason", "superseded")[0] == 0

    code, listed, err = cli(capsys, "list")
    assert (code, err) == (0, "")
    assert [r["model_revision"] for r in listed] == ["smollm2@v1", "smollm2@v2", "old@1"]  # as approved
    v1, v2, old = listed
    assert v1 == {"model_revision": "smollm2@v1", "aliases": [{"alias": "smollm2", "allowed_tenants": ["*"]}],
                  "model_path": "/m/v1", "engine_config_hash": "aaa", "max_model_len": 2048,
                  "price_input_per_1k_micros": 100, "price_output_per_1k_micros": 400,
                  "engine_settings": resolve({}, detect_device()).model_dump(),  # this host's defaults
                  "retired": False, "retired_reason": None, "artifacts": None}
    assert v2["aliases"] == [{"alias": "smollm2-acme", "allowed_tenants": ["acme"]},
                             {"alias": "smollm2-next", "allowed_tenants": ["*"]}]
    assert (v2["price_input_per_1k_micros"], v2["price_output_per_1k_micros"], v2["max_model_len"]) == (150, 600, 4096)
    assert (old["retired"], old["retired_reason"], old["aliases"]) == (
        True, "superseded", [{"alias": "old", "allowed_tenants": ["*"]}])

    # an alias moved, or deleted, no longer shows under the revision it pointed at
    assert cli(capsys, "alias", "smollm2", "smollm2@v2")[0] == 0
    assert cli(capsys, "delete-alias", "smollm2-acme")[0] == 0
    v1, v2, _ = cli(capsys, "list")[1]
    assert v1["aliases"] == []
    assert [a["alias"] for a in v2["aliases"]] == ["smollm2", "smollm2-next"]


def test_admin_model_approve_refuses_a_negative_price_in_a_line(home, capsys):
    with pytest.raises(SystemExit) as exited:
        api.cli.main.main(["admin", "model", "approve", "--alias", "a", "--revision", "a@1", "--path", "/m",
                           "--config-hash", "x", "--max-model-len", "8", "--price-output-per-1k-micros", "-5"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--price-output-per-1k-micros" in err and "not negative" in err and "Traceback" not in err
    assert cli(capsys, "list") == (0, [], "")
