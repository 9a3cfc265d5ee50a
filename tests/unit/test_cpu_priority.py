"""The engine's processes run below the platform's threads: every thread of them gets the
added nice value, and a worker leading its own session lowers its scheduling group. The
serving processes shorten their interpreter's thread switch interval."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import psutil
import pytest

from tests.helpers import ROOT, Launched
from workers.vllm_engine import lower_cpu_priority

BUSY_CHILD = textwrap.dedent("""
    import threading, time
    for _ in range(3):
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(60)  # kept alive until the test stops it
""")


@pytest.fixture
def child():
    with Launched([sys.executable, "-c", BUSY_CHILD], ready="ready", ready_s=30) as process:
        yield psutil.Process(process.pid)


def thread_nices(process: psutil.Process) -> list[int]:
    return [os.getpriority(os.PRIO_PROCESS, t.id) for t in process.threads()]


def test_every_thread_of_the_engine_processes_gets_the_added_nice(child):
    before = thread_nices(child)
    assert len(before) == 4
    lower_cpu_priority([child], 5)
    assert thread_nices(child) == [min(19, n + 5) for n in before]


def test_nothing_changes_with_zero_and_a_gone_process_is_passed_over(child):
    before = thread_nices(child)
    lower_cpu_priority([child], 0)
    assert thread_nices(child) == before
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ghost = psutil.Process(gone.pid)
    gone.kill()
    gone.wait(timeout=30)  # the handle now names a process that has exited
    lower_cpu_priority([ghost, child], 3)
    assert thread_nices(child) == [min(19, n + 3) for n in before]


SESSION_PROBE = textwrap.dedent("""
    import json, os, sys
    from pipelines.process_tuning import lower_session_priority
    lowered = lower_session_priority(int(sys.argv[1]))
    group = open("/proc/self/autogroup").read().strip() if os.path.exists("/proc/self/autogroup") else ""
    print(json.dumps({"lowered": lowered, "group": group}))
""")


def probe(nice: int, *, own_session: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", SESSION_PROBE, str(nice)], capture_output=True, text=True,
                         timeout=60, check=True, start_new_session=own_session,
                         cwd=ROOT)
    return json.loads(out.stdout)


def test_a_worker_leading_its_own_session_lowers_its_group():
    result = probe(7, own_session=True)
    if os.path.exists("/proc/self/autogroup"):  # Linux with autogroup scheduling (CI's kernel has it)
        assert result["lowered"] is True
        assert result["group"].endswith("nice 7")
    else:
        assert result == {"lowered": False, "group": ""}


def test_a_worker_sharing_its_session_leaves_the_group_alone():
    before = open("/proc/self/autogroup").read().strip() if os.path.exists("/proc/self/autogroup") else ""
    result = probe(7, own_session=False)
    assert result["lowered"] is False
    assert result["group"] == before  # the session it shares is the test's own


@pytest.fixture
def switch_interval():
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_every_serving_process_sets_the_configured_switch_interval(monkeypatch, switch_interval):
    import api.cli.main
    import api.cli.processes as processes

    seen = {}

    def run(process, *_args, **_kwargs):
        seen[process.name] = sys.getswitchinterval()
        sys.setswitchinterval(0.005)
        return 0

    monkeypatch.setenv("LEDGERLM_SWITCH_INTERVAL_MS", "2.5")
    monkeypatch.delenv("LEDGERLM_CPUS", raising=False)
    monkeypatch.setattr(processes, "run", run)
    monkeypatch.setattr(processes, "stop_on_signal", threading.Event)  # the session's own handlers stay
    in_process = [name for name, process in processes.PROCESSES.items() if process.exec_argv is None]
    assert {"api", "admission", "worker", "projector", "rollouts"} <= set(in_process)
    for name in in_process:
        sys.setswitchinterval(0.005)
        assert api.cli.main.main(["serve", name]) == 0
    assert seen == {name: pytest.approx(0.0025) for name in in_process}


def test_the_switch_interval_defaults_to_one_millisecond_and_must_be_positive(monkeypatch):
    from pydantic import ValidationError

    from models.settings import Settings

    monkeypatch.delenv("LEDGERLM_SWITCH_INTERVAL_MS", raising=False)
    assert Settings().switch_interval_ms == 1.0
    with pytest.raises(ValidationError):
        Settings(switch_interval_ms=0)
