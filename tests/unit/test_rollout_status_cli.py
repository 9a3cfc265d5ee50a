"""`ledgerlm rollout status ALIAS` in-process: an alias without the rollout asked for is said
on stderr with exit status 1, never an empty answer that looks like success."""
from __future__ import annotations

import json

import pytest

import api.cli.main
from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.bootstrap import Bootstrap

STABLE, CANDIDATE = "tiny@1", "tiny@2"


@pytest.fixture
def platform(tmp_path, monkeypatch):
    for name in ("LEDGERLM_EVENT_LOG_URL", "LEDGERLM_EVENT_LOG_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LEDGERLM_HOME", str(tmp_path))
    with Bootstrap(Settings()).event_log() as log:
        view = admin.RegistryView(log)
        for revision in (STABLE, CANDIDATE):
            admin.approve_model(view, alias="tiny", model_revision=revision, model_path="/m",
                                engine_config_hash=revision, max_model_len=512, actor="ops")
        admin.set_alias(view, alias="tiny", model_revision=STABLE, actor="ops")
        view.close()


def cli(capsys, *argv: str) -> tuple[int, list[dict], str]:
    code = api.cli.main.main(list(argv))
    out = capsys.readouterr()
    return code, [json.loads(line) for line in out.out.splitlines()], out.err


def test_status_of_an_alias_without_a_rollout_says_so_and_exits_1(platform, capsys):
    code, out, err = cli(capsys, "rollout", "status", "tiny")
    assert (code, out) == (1, [])
    assert err == "error: alias 'tiny' has no rollout under way (--all shows ended ones too)\n"
    code, out, err = cli(capsys, "rollout", "status", "tiny", "--all")
    assert (code, out, err) == (1, [], "error: alias 'tiny' has had no rollout\n")
    code, out, err = cli(capsys, "rollout", "status", "nope")
    assert (code, out) == (1, []) and err.startswith("error: alias 'nope' does not exist") and "tiny" in err


def test_status_of_an_alias_with_a_rollout_shows_it_and_an_ended_one_only_with_all(platform, capsys):
    code, [started], _ = cli(capsys, "rollout", "start", "tiny", CANDIDATE)
    assert code == 0
    code, [shown], err = cli(capsys, "rollout", "status", "tiny")
    assert (code, err) == (0, "") and shown["rollout_id"] == started["rollout_id"]
    assert cli(capsys, "rollout", "rollback", "tiny")[0] == 0
    code, out, err = cli(capsys, "rollout", "status", "tiny")
    assert (code, out) == (1, []) and "no rollout under way" in err
    code, [ended], err = cli(capsys, "rollout", "status", "tiny", "--all")
    assert (code, err) == (0, "") and ended["status"] == "rolled back"
    # without an alias, the open rollouts: none is an empty answer, not an error
    assert cli(capsys, "rollout", "status") == (0, [], "")
