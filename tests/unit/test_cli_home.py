"""The `ledgerlm` command names the home and event log it uses: one stderr line when
LEDGERLM_HOME is unset, a refusal of a read against a default home with no log, and
not-found errors that say which log they looked in. stdout stays what scripts parse."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import api.cli.main
from api.cli import home as cli_home

ROOT = Path(__file__).resolve().parents[2]
URL_VARS = ("LEDGERLM_HOME", "LEDGERLM_EVENT_LOG_URL", "LEDGERLM_EVENT_LOG_NAMESPACE", "LEDGERLM_DATABASE_URL")


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    """A project directory with a `.local` folder, as the current one, and no LEDGERLM_HOME."""
    for name in URL_VARS:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / ".local").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path.resolve()


def cli(capsys, *argv: str) -> tuple[int, list[dict], list[str]]:
    code = api.cli.main.main(list(argv))
    out = capsys.readouterr()
    return code, [json.loads(line) for line in out.out.splitlines()], out.err.splitlines()


def default_log(here: Path) -> str:
    return f"sqlite:///{here}/.local/ledgerlm/eventlog.db"


def test_unset_home_says_the_default_home_and_log_once_on_stderr(here, capsys):
    code, out, err = cli(capsys, "admin", "tenant", "create", "acme")
    assert (code, out) == (0, [{"tenant_id": "acme"}])
    assert err == [f"ledgerlm: LEDGERLM_HOME is not set; using {here}/.local/ledgerlm (log {default_log(here)})"]
    code, out, err = cli(capsys, "admin", "tenant", "list")
    assert code == 0 and [t["tenant_id"] for t in out] == ["acme"] and len(err) == 1


def test_a_tenant_not_found_names_the_log_it_was_looked_for_in(here, capsys):
    cli(capsys, "admin", "tenant", "create", "acme")
    code, out, err = cli(capsys, "admin", "key", "issue", "--tenant", "nobody")
    assert (code, out) == (2, [])
    assert err[1] == (f"error: tenant 'nobody' does not exist in the log at {default_log(here)} "
                      f"(LEDGERLM_HOME unset: using the default home .local/ledgerlm)")
    code, _, err = cli(capsys, "rollout", "status", "nope")
    assert code == 1 and err[1].startswith("error: alias 'nope' does not exist") and default_log(here) in err[1]


def test_a_set_home_is_named_in_a_not_found_error_and_nothing_is_said_before(here, capsys, monkeypatch):
    monkeypatch.setenv("LEDGERLM_HOME", str(here / "quickstart"))
    cli(capsys, "admin", "tenant", "create", "acme")
    code, _, err = cli(capsys, "admin", "limits", "show", "nobody")
    assert code == 2
    assert err == [f"error: tenant 'nobody' does not exist in the log at sqlite:///{here}/quickstart/eventlog.db "
                   f"(LEDGERLM_HOME={here}/quickstart)"]


def test_a_read_against_a_default_home_with_no_log_is_refused_and_names_homes_that_have_one(here, capsys,
                                                                                          monkeypatch):
    monkeypatch.setenv("LEDGERLM_HOME", str(here / ".local" / "quickstart"))
    cli(capsys, "admin", "tenant", "create", "acme")  # the Quickstart's home, in another shell
    monkeypatch.delenv("LEDGERLM_HOME")
    for argv, what in ((["admin", "tenant", "list"], "event log"), (["admin", "key", "issue", "--tenant", "acme"],
                       "event log"), (["rollout", "status"], "event log"),
                       (["usage", "report", "--month", "2027-01"], "database")):
        code, out, err = cli(capsys, *argv)
        assert (code, out, len(err)) == (2, [], 1), (argv, err)
        assert err[0].startswith(f"error: LEDGERLM_HOME is not set and the default home {here}/.local/ledgerlm "
                                 f"has no {what} (sqlite:///{here}/.local/ledgerlm/"), err[0]
        assert err[0].endswith(f"set LEDGERLM_HOME to the platform's home (homes with a log here: "
                               f"{here}/.local/quickstart)"), err[0]
    assert not (here / ".local" / "ledgerlm").exists()  # no empty log left behind


def test_without_home_or_project_directory_it_says_what_to_set(here, capsys):
    (here / ".local").rmdir()
    code, out, err = cli(capsys, "admin", "tenant", "list")
    assert (code, out) == (2, []) and len(err) == 1
    assert f"{here} has no .local directory" in err[0] and "set LEDGERLM_HOME" in err[0]
    code, out, err = cli(capsys, "admin", "tenant", "create", "acme")  # making state still works
    assert (code, out) == (0, [{"tenant_id": "acme"}]) and len(err) == 1
    assert err[0].startswith(f"ledgerlm: LEDGERLM_HOME is not set and {here} has no .local directory; using a new "
                             f"home {here}/.local/ledgerlm (log {default_log(here)})") and "set LEDGERLM_HOME" in err[0]


def test_an_explicit_log_url_is_named_and_not_refused(here, capsys, monkeypatch):
    url = f"sqlite:///{here}/elsewhere.db"
    monkeypatch.setenv("LEDGERLM_EVENT_LOG_URL", url)
    code, out, err = cli(capsys, "admin", "tenant", "list")  # the default home has no log: the URL is what counts
    assert (code, out) == (0, [])
    assert err == [f"ledgerlm: LEDGERLM_HOME is not set; using {here}/.local/ledgerlm (log {url})"]
    code, _, err = cli(capsys, "admin", "tenant", "suspend", "nobody")
    assert code == 2 and err[1] == f"error: tenant 'nobody' does not exist in the log at {url} (LEDGERLM_EVENT_LOG_URL)"


def test_a_command_that_touches_no_state_says_nothing_of_the_home(here, capsys, monkeypatch):
    monkeypatch.delenv("LEDGERLM_API_KEY", raising=False)
    with pytest.raises(SystemExit, match="give an API key"):
        api.cli.main.main(["batch", "list"])
    assert capsys.readouterr().err == ""


def test_model_tools_that_use_the_home_say_it_before_handing_over(here, capsys):
    cli_home.announce_model_tool(["model", "approve", "--alias", "x"])
    assert capsys.readouterr().err == f"ledgerlm: LEDGERLM_HOME is not set; using {here}/.local/ledgerlm " \
                                      f"(log {default_log(here)})\n"
    cli_home.announce_model_tool(["model", "make-tiny", "d"])
    assert capsys.readouterr().err == ""


def test_stdout_of_the_command_stays_json_with_the_home_unset(here):
    env = {k: v for k, v in os.environ.items() if k not in URL_VARS} | {"PYTHONPATH": str(ROOT)}

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "api.cli", *argv], cwd=here, env=env, capture_output=True,
                              text=True, timeout=120)

    created = run("admin", "tenant", "create", "acme")
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout) == {"tenant_id": "acme"}
    issued = run("admin", "key", "issue", "--tenant", "acme")
    assert issued.returncode == 0, issued.stderr
    assert json.loads(issued.stdout)["api_key"].startswith("llm-")
    assert issued.stderr.startswith("ledgerlm: LEDGERLM_HOME is not set; using ")
