"""The platform's processes, declared once (`api.cli.processes.PROCESSES`): `ledgerlm serve`
offers exactly those, process tuning knows each, infra/compose.yaml runs each as a service
of its own and the README's quickstart starts each, in the declared order. And the one run
loop every process runs under: ready line, metrics and readiness, stop, closing, exit status."""
from __future__ import annotations

import argparse
import json
import re
import threading
from collections import Counter

import httpx
import pytest
import yaml

from api.cli.processes import PROCESSES, Process, arguments, run
from api.process_kit import Refused, Started
from models.settings import Settings
from pipelines.outage import Readiness
from pipelines.process_tuning import PLACED_AT_START
from tests.harness import free_port
from tests.helpers import ROOT


def compose_processes() -> list[str]:
    """The process each service of infra/compose.yaml runs with `ledgerlm serve`, in order."""
    services = yaml.safe_load((ROOT / "infra" / "compose.yaml").read_text())["services"]
    commands = [service.get("command") for service in services.values()]
    return [command[2] for command in commands if isinstance(command, list) and command[:2] == ["ledgerlm", "serve"]]


def quickstart_processes() -> list[str]:
    """The processes the README's quickstart starts with `ledgerlm serve`, in order."""
    readme = (ROOT / "README.md").read_text()
    assert "\n## Quickstart\n" in readme, "the README has no Quickstart section"
    section = readme.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^ledgerlm serve (\S+)", section, re.M)


def test_compose_runs_each_declared_process_as_a_service_of_its_own():
    found = compose_processes()
    assert Counter(found) == Counter(list(PROCESSES)), f"infra/compose.yaml serves {found}; declared: {list(PROCESSES)}"


def test_the_quickstart_starts_each_declared_process_in_the_declared_order():
    assert quickstart_processes() == list(PROCESSES)


def test_serve_offers_exactly_the_declared_processes_and_tuning_knows_each():
    from api.cli.main import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001
    offered = next(a for a in serve._actions if a.dest == "process").choices  # noqa: SLF001
    assert list(offered) == list(PROCESSES)
    assert set(PROCESSES) == set(PLACED_AT_START)
    for process in PROCESSES.values():
        assert (process.start is None) != (process.exec_argv is None), f"{process.name}: started or exec'd, not both"
        assert process.argv()[1:] == ["-m", "api.cli", "serve", process.name]


def test_each_process_takes_only_its_own_flags():
    worker = arguments("worker", "--alias", "tiny", "--admit")
    assert (worker.process, worker.alias, worker.admit, worker.pool) == ("worker", "tiny", True, None)
    with pytest.raises(SystemExit):
        arguments("worker", "--alias", "a", "--revision", "r")  # one or the other
    with pytest.raises(SystemExit):
        arguments("admission", "--pool", "p")


@pytest.fixture
def loop_settings(tmp_path) -> Settings:
    return Settings(home=tmp_path, metrics_port=free_port())


def test_the_loop_serves_metrics_says_ready_runs_until_stopped_and_closes_the_last_opened_first(loop_settings,
                                                                                                  capsys):
    closed, seen = [], {}
    stop = threading.Event()

    def start(launch, *, main):
        launch.held.callback(closed.append, "opened first")
        launch.held.callback(closed.append, "opened last")
        return Started(main, lambda stopped: seen.setdefault("stopped", stopped.wait(30)),
                       readiness=(Readiness("fake"),), ready=lambda: {"fake": True},
                       ready_line=lambda port: {"fake": "ready", "metrics_port": port}, exit_code=lambda: 5)

    def started(running: Started) -> None:
        seen["main"] = running.main
        base = f"http://127.0.0.1:{loop_settings.metrics_port}"
        seen["metrics"] = httpx.get(base + "/metrics", timeout=10).text
        seen["readyz"] = httpx.get(base + "/readyz", timeout=10).json()
        stop.set()

    code = run(Process("fake", "a process of the test's", start), loop_settings, argparse.Namespace(), stop,
               given={"main": "the component"}, started=started)
    assert code == 5, "its own exit status, once closed"
    assert seen["main"] == "the component" and seen["stopped"] is True
    assert 'ledgerlm_ready{component="fake"} 1.0' in seen["metrics"]
    assert seen["readyz"] == {"status": "ready", "checks": {"fake": True}}
    assert closed == ["opened last", "opened first"]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {
        "fake": "ready", "metrics_port": loop_settings.metrics_port}
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{loop_settings.metrics_port}/metrics", timeout=2)  # closed with the rest


def test_an_error_it_cannot_ride_out_goes_to_fatal_before_it_closes_and_is_raised_without_one(tmp_path):
    said = []

    def start(launch):
        launch.held.callback(said.append, "closed")

        def run_once(_stop):
            raise RuntimeError("broken")
        return Started(None, run_once)

    broken = Process("broken", "fails as it runs", start)
    stop = threading.Event()
    code = run(broken, Settings(home=tmp_path), argparse.Namespace(), stop,
               fatal=lambda exc: said.append(str(exc)) or 70)
    assert code == 70 and said == ["broken", "closed"] and stop.is_set()
    with pytest.raises(RuntimeError, match="broken"):
        run(broken, Settings(home=tmp_path), argparse.Namespace(), threading.Event())
    assert said[-1] == "closed"


def test_a_process_that_refuses_to_start_closes_what_it_opened_and_serves_nothing(tmp_path):
    closed = []

    def start(launch):
        launch.held.callback(closed.append, "log")
        raise Refused("ledgerlm serve refusing: not today")

    with pytest.raises(Refused, match="not today") as refused:
        run(Process("refusing", "refuses", start), Settings(home=tmp_path), argparse.Namespace(), threading.Event(),
            started=lambda _: pytest.fail("a refused process never serves"))
    assert refused.value.code == 2 and closed == ["log"]
