"""Where the serving processes run: `LEDGERLM_CPUS` moves every thread of the API and
admission; a worker starts its engine with every CPU and then keeps its own threads off the
CPUs the engine bound its compute threads to. Each placement runs in a child process, so the
test session keeps its CPUs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from contextlib import contextmanager

import psutil
import pytest
from pydantic import ValidationError

from models.settings import Settings, format_cpu_list, parse_cpu_list
from pipelines.process_tuning import PLACED_AT_START, tune_process
from tests.helpers import ROOT, Launched
from workers.vllm_engine import bound_cpus, confine_threads

ALLOWED = sorted(os.sched_getaffinity(0))


def two_cpus() -> tuple[int, int]:
    assert len(ALLOWED) >= 2, f"placement needs a host with two CPUs or more; this process may use {ALLOWED}"
    return ALLOWED[0], ALLOWED[1]


def in_child(script: str, **env: str) -> dict:
    """Runs `script` in a fresh interpreter at the repository root; its last line is JSON."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


AFFINITIES = """
    def affinities():
        return sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")})
"""


def test_cpu_lists_read_and_write_as_linux_writes_them():
    assert parse_cpu_list("0-3,8") == {0, 1, 2, 3, 8}
    assert parse_cpu_list(" 5 ") == {5}
    assert format_cpu_list({8, 0, 1, 2, 3}) == "0-3,8"
    assert format_cpu_list({1, 3}) == "1,3"
    for text in ("", "a", "3-1", "-1", "1,,2", "1-2-3"):
        with pytest.raises(ValueError, match="not a CPU list"):
            parse_cpu_list(text)


def test_the_setting_is_checked_when_read(monkeypatch):
    monkeypatch.delenv("LEDGERLM_CPUS", raising=False)
    assert Settings().cpus == "" and Settings().cpu_set() is None
    assert Settings(cpus="all").cpu_set() is None
    assert Settings(cpus="1,3-4").cpu_set() == {1, 3, 4}
    with pytest.raises(ValidationError, match="not a CPU list"):
        Settings(cpus="first")


def test_run_on_cpus_moves_every_thread_and_later_threads_follow():
    first, _ = two_cpus()
    result = in_child(AFFINITIES + f"""
    import json, os, threading, time
    from pipelines.process_tuning import run_on_cpus
    for _ in range(3):
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    before = affinities()
    run_on_cpus({{{first}}})
    after = affinities()
    later = []
    thread = threading.Thread(target=lambda: later.append(sorted(os.sched_getaffinity(0))))
    thread.start(); thread.join()
    print(json.dumps({{"before": before, "after": after, "later": later[0], "threads": len(os.listdir("/proc/self/task"))}}))
    """)
    assert result["before"] == [ALLOWED]
    assert result["threads"] >= 4  # the three started here, the main one, and any an import started
    assert result["after"] == [[first]]
    assert result["later"] == [first]


def test_cpus_this_process_may_not_use_are_refused_and_nothing_moves():
    result = in_child(AFFINITIES + """
    import json, os
    from pipelines.process_tuning import run_on_cpus
    try:
        run_on_cpus({4096})
        error = None
    except ValueError as exc:
        error = str(exc)
    print(json.dumps({"error": error, "after": affinities()}))
    """)
    assert "none of CPUs 4096 is available" in result["error"]
    assert result["after"] == [ALLOWED]


SERVE_PROBE = AFFINITIES + """
    import json, os
    import api.cli.main
    import api.cli.processes
    seen = {}
    def record(*_args, **_kwargs):
        seen["cpus"] = affinities()
        return 0
    api.cli.processes.run = record  # where `serve` has tuned the process, before it starts anything
    {call}
    print(json.dumps(seen))
"""


@pytest.mark.parametrize("process", ["api", "admission"])
def test_the_api_and_admission_run_where_the_setting_says(process):
    _, second = two_cpus()
    result = in_child(SERVE_PROBE.replace("{call}", f"assert api.cli.main.main(['serve', '{process}']) == 0"),
                      LEDGERLM_CPUS=str(second))
    assert result["cpus"] == [[second]]


def test_a_worker_starts_with_every_cpu_whatever_the_setting():
    """Its engine's processes inherit where it runs, and must be free to bind their own."""
    _, second = two_cpus()
    result = in_child(SERVE_PROBE.replace("{call}", "assert api.cli.main.main(['serve', 'worker']) == 0"),
                      LEDGERLM_CPUS=str(second))
    assert result["cpus"] == [ALLOWED]


PLACE_PROBE = AFFINITIES + """
    import json, os
    from models.settings import Settings
    from workers.serving import place_beside_engine
    class Engine:
        def compute_cpus(self):
            return set(json.loads(os.environ["BOUND"]))
    placed = place_beside_engine(Settings(), Engine())
    print(json.dumps({"placed": sorted(placed) if placed is not None else None, "after": affinities()}))
"""


def test_a_worker_keeps_off_the_cpus_its_engine_bound():
    first, _ = two_cpus()
    rest = [cpu for cpu in ALLOWED if cpu != first]
    result = in_child(PLACE_PROBE, BOUND=json.dumps([first]), LEDGERLM_CPUS="")
    assert result == {"placed": rest, "after": [rest]}


@pytest.mark.parametrize("bound, cpus, expected", [
    ("[]", "", None),  # the engine bound nothing: nothing to keep off
    ("all", "", None),  # bound to every CPU: nowhere else to go
    ("first", "all", None),  # placement turned off
    ("first", "first", "first"),  # the setting wins over the engine's CPUs
])
def test_a_worker_stays_put_or_goes_where_it_is_told(bound, cpus, expected):
    first, _ = two_cpus()
    names = {"all": ALLOWED, "first": [first], "[]": []}
    result = in_child(PLACE_PROBE, BOUND=json.dumps(names[bound]),
                      LEDGERLM_CPUS={"": "", "all": "all", "first": str(first)}[cpus])
    if expected is None:
        assert result == {"placed": None, "after": [ALLOWED]}
    else:
        assert result == {"placed": names[expected], "after": [names[expected]]}


@contextmanager
def child_with_a_bound_thread(cpu: int):
    """A process with three threads: its main one and one more free to run anywhere, and one
    bound to `cpu`. Stopped on leaving."""
    script = textwrap.dedent(f"""
        import os, threading, time
        bound = threading.Event()
        def pinned():
            os.sched_setaffinity(0, {{{cpu}}})
            bound.set()
            time.sleep(60)
        threading.Thread(target=pinned, daemon=True).start()
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        assert bound.wait(30), "the thread never bound itself"
        print("ready", flush=True)
        time.sleep(60)  # kept alive until the test stops it
    """)
    with Launched([sys.executable, "-c", script], ready="ready", ready_s=30) as child:
        yield psutil.Process(child.pid)


def test_bound_cpus_are_those_of_threads_narrower_than_the_host():
    first, _ = two_cpus()
    with child_with_a_bound_thread(first) as process:
        assert bound_cpus([process], set(ALLOWED)) == {first}
        assert bound_cpus([process], {first}) == set(), "a thread on every CPU there is is not bound"
    assert bound_cpus([process], set(ALLOWED)) == set(), "a process that is gone binds nothing"


def test_confining_moves_the_free_threads_and_leaves_those_bound_within():
    """How a pinned engine (`LEDGERLM_ENGINE_PINNED`) keeps its scheduler beside its compute
    thread: every thread free to run elsewhere moves; one bound inside the CPUs stays."""
    first, second = two_cpus()
    with child_with_a_bound_thread(first) as process:
        def affinities():
            return sorted(sorted(os.sched_getaffinity(t.id)) for t in process.threads())
        free = len(process.threads()) - 1
        assert confine_threads([process], {first}) == free
        assert affinities() == [[first]] * (free + 1)
        assert confine_threads([process], {first}) == 0, "nothing is left to move"
        assert confine_threads([process], {second}) == free + 1, "a thread bound elsewhere moves too"
        assert affinities() == [[second]] * (free + 1)
    assert confine_threads([process], {first}) == 0, "a process that is gone has nothing to move"


@pytest.mark.parametrize("command", [["-m", "api.cli", "serve", "api"], ["-m", "api.cli", "serve", "admission"],
                                     ["-m", "workers", "serve", "worker"]])
def test_cpus_a_process_may_not_use_stop_it_with_a_clear_error_before_it_starts(command, tmp_path):
    out = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "LEDGERLM_CPUS": "4096", "LEDGERLM_HOME": str(tmp_path),
                              "LEDGERLM_EVENT_LOG_URL": "", "LEDGERLM_API_PORT": "1"})
    assert out.returncode == 2, out.stderr[-2000:]
    assert "LEDGERLM_CPUS: none of CPUs 4096 is available to this process" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "eventlog.db").exists(), "it stopped before opening the log"


def test_every_serving_process_is_a_role_process_tuning_knows():
    """`ledgerlm serve X` tunes itself as role X: a process added without a role fails here,
    not when it starts."""
    from api.cli.main import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    processes = next(a for a in serve._actions if a.dest == "process").choices
    assert set(processes) <= set(PLACED_AT_START)
    with pytest.raises(KeyError, match="unknown serving process"):
        tune_process(Settings(), "no-such-process")
