"""The reaper (`workers.reaper`) with plain processes: a parent SIGKILLed (no handler runs)
takes its children and theirs with it, one that ignores SIGTERM included; a parent that
releases its reaper keeps its children, and the reaper exits by itself."""
from __future__ import annotations

import json
import os
import signal
import sys
import textwrap

import psutil

from tests.helpers import Launched, wait_until

GRACE_S = 1.0
# The refresh, the grace and a SIGKILL, with room for a loaded host.
REAPED_WITHIN_S = 15.0

PARENT = textwrap.dedent("""
    import json, subprocess, sys, time
    from workers.reaper import Reaper

    stubborn = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('deaf', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline() == "deaf\\n"  # SIGTERM is ignored from here on
    sleeper = subprocess.Popen(["sh", "-c", "sleep 600; :"])  # a shell with a child of its own
    reaper = Reaper.start(grace_s={grace}, refresh_s=0.1)
    pids = {{"reaper": reaper.pid, "stubborn": stubborn.pid, "sleeper": sleeper.pid}}
    if sys.argv[1] == "release":
        reaper.release()
    print(json.dumps(pids), flush=True)
    time.sleep(600)
""").format(grace=GRACE_S)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def launch(mode: str) -> tuple[Launched, dict[str, int]]:
    parent = Launched([sys.executable, "-c", PARENT, mode], ready='"reaper"', ready_s=60, stop_s=5)
    return parent, json.loads(parent.ready_line)


def test_a_sigkilled_parent_s_children_and_grandchildren_end_and_the_reaper_exits():
    parent, pids = launch("watch")
    with parent:
        descendants = {p.pid for p in psutil.Process(parent.pid).children(recursive=True)}
        assert {pids["stubborn"], pids["sleeper"], pids["reaper"]} <= descendants
        assert len(descendants) == 4, "the sleeper's shell has its sleep"
        os.kill(parent.pid, signal.SIGKILL)
        wait_until(lambda: not any(alive(pid) for pid in descendants), REAPED_WITHIN_S,
                   what=f"the killed parent's processes {sorted(descendants)} to end")


def test_a_released_reaper_exits_by_itself_and_ends_nothing():
    parent, pids = launch("release")
    with parent:
        assert not alive(pids["reaper"]), "release() waits for the reaper to exit"
        assert alive(pids["stubborn"]) and alive(pids["sleeper"]), "the reaper ended nothing"
