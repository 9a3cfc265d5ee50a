"""What a long-running serving process sets for itself: where its threads run (CPU
affinity), how long one thread may hold the interpreter, and the scheduling group of a
worker's session. Entrypoints call `tune_process` once, before they open anything; the
settings say what (`LEDGERLM_CPUS`, `LEDGERLM_SWITCH_INTERVAL_MS`, `LEDGERLM_ENGINE_NICE`)."""
from __future__ import annotations

import os
import sys
import time

from models.settings import Settings, format_cpu_list

# Whether each serving process moves onto `settings.cpus` at start. A worker does not: its
# engine's processes inherit where it runs and must start with every CPU, to bind their
# compute threads where they choose; it places itself beside them later.
PLACED_AT_START = {"api": True, "admission": True, "projector": True, "batch-dispatcher": True,
                   "batch-worker": True, "rollouts": True, "worker": False}


def tune_process(settings: Settings, role: str) -> None:
    """Tunes this process for `role` (a key of `PLACED_AT_START`). CPUs the process may not
    use are refused here (ValueError), for every role, before anything starts."""
    if role not in PLACED_AT_START:
        raise KeyError(f"unknown serving process {role!r}; one of {sorted(PLACED_AT_START)}")
    sys.setswitchinterval(settings.switch_interval_ms / 1000)
    cpus = settings.cpu_set()
    if cpus is not None:
        usable_cpus(cpus)
        if PLACED_AT_START[role]:
            run_on_cpus(cpus)


def usable_cpus(cpus: set[int]) -> set[int]:
    """Those of `cpus` this process may run on; a ValueError when there are none."""
    usable = cpus & os.sched_getaffinity(0)
    if not usable:
        raise ValueError(f"none of CPUs {format_cpu_list(cpus)} is available to this process "
                         f"(it may use {format_cpu_list(os.sched_getaffinity(0))})")
    return usable


def run_on_cpus(cpus: set[int]) -> None:
    """Moves every thread of this process onto `cpus`; threads started later inherit it
    from whoever starts them. A ValueError when this process may use none of them."""
    usable = usable_cpus(cpus)
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), usable)
        except ProcessLookupError:  # the thread ended meanwhile
            pass


def lower_session_priority(nice: int) -> bool:
    """Where this process leads a session of its own and Linux schedules sessions as groups
    (autogroup), CPUs are shared between sessions before threads: lowering the engine's
    threads alone would not let another session's API or admission in sooner. So the
    group, which holds this worker and its engine processes, is lowered too. True if it
    was; a process sharing its session with others leaves it alone."""
    if nice <= 0 or os.getsid(0) != os.getpid():
        return False
    for _ in range(5):
        try:
            with open("/proc/self/autogroup", "w") as autogroup:
                autogroup.write(str(nice))
            return True
        except BlockingIOError:  # without CAP_SYS_ADMIN, one change per 100 ms on the whole host
            time.sleep(0.11)
        except OSError:  # no autogroup here (another OS, or cgroups decide): nothing to do
            return False
    return False
