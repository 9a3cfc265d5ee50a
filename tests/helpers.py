"""What tests wait and launch with: `wait_until` a condition holds, with a deadline and a
name for the failure, and `Launched`, a process started for a test that is waited for,
stopped, and shown when something fails. Imports nothing of the platform, so unit tests
can use it without loading the API or the engine."""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
OUTPUT_SHOWN = 3000  # characters of a process's output a failure shows, its last


def wait_until(condition: Callable[[], T], timeout_s: float = 30.0, *, what: str, every_s: float = 0.05) -> T:
    """Re-checks `condition` until it returns something truthy, and returns that; fails the
    test naming `what` after `timeout_s`. `every_s=0` suits a condition that blocks on its
    own for a while (a poll with a timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)


def _short(arg) -> str:
    words = " ".join(str(arg).split())  # a script given with -c reads as its first words
    return words if len(words) <= 40 else words[:37] + "..."


class Launched:
    """A process started for a test, leading a session of its own, its stdout and stderr in
    `log` (a temporary file when none is given). With `ready`, waits up to `ready_s` for a
    line holding it (the process says it serves) and fails, with the output, if the process
    exits first. As a context manager it is stopped on leaving, and its output printed when
    the block failed (pytest shows it with the failure)."""

    def __init__(self, argv: list[str], *, log: Path | None = None, env: dict[str, str] | None = None,
                 cwd: Path = ROOT, ready: str | None = None, ready_s: float = 120.0, stop_s: float = 30.0):
        self.name = " ".join(_short(a) for a in argv[1:4])
        self._own_log = log is None
        if log is None:
            fd, path = tempfile.mkstemp(prefix="ledgerlm-test-", suffix=".log")
            os.close(fd)
            log = Path(path)
        self.log, self.stop_s, self._final = Path(log), stop_s, None
        with self.log.open("w") as out:  # the child keeps its own handle
            self.proc = subprocess.Popen([str(a) for a in argv], env=env, cwd=cwd, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.ready_line = self.wait_for_output(ready, ready_s) if ready else None
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self._final if self._final is not None else self.log.read_text(errors="replace")

    def shown(self) -> str:
        """What a failure says of the process: its command, state and last output."""
        state = "running" if self.running() else f"exited with {self.proc.returncode}"
        return f"`{self.name}` ({state}), its output ends:\n{self.output()[-OUTPUT_SHOWN:]}"

    def wait_until(self, condition: Callable[[], T], timeout_s: float, *, what: str) -> T:
        """`wait_until` that fails at once, with the output, when the process exits first."""
        def holds_or_exited():
            value = condition()
            if value:
                return value
            if not self.running():
                raise AssertionError(f"gone before {what}: {self.shown()}")
            return None
        try:
            return wait_until(holds_or_exited, timeout_s, what=what, every_s=0.1)
        except AssertionError as exc:
            if "gone before" in str(exc):
                raise
            raise AssertionError(f"{exc}: {self.shown()}") from None

    def wait_for_output(self, needle: str, timeout_s: float) -> str:
        """The first line of output holding `needle`, once there is one."""
        return self.wait_until(lambda: next((line for line in self.output().splitlines() if needle in line), None),
                               timeout_s, what=f"{needle!r} from `{self.name}`")

    def check(self) -> None:
        """Fails if the process has exited (it was meant to run until stopped)."""
        assert self.running(), f"exited early: {self.shown()}"

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float | None = None) -> int:
        """Sends `sig` to the process (not its session: a Celery main process stops its own
        children), SIGKILLs its session after `timeout_s` (default `stop_s`) and whatever of it
        outlived it; returns the exit status."""
        if self.running():
            self.proc.send_signal(sig)
            try:
                self.proc.wait(self.stop_s if timeout_s is None else timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # nothing of its session is left
        self.proc.wait(10)
        if self._own_log and self._final is None:
            self._final = self.output()
            self.log.unlink(missing_ok=True)
        return self.proc.returncode

    def __enter__(self) -> "Launched":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            print(f"--- {self.shown()}")
        self.stop()
