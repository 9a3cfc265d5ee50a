"""A process's children end with it, whatever ends it: a SIGKILLed worker would otherwise
leave its vLLM engine (the EngineCore process, its Worker and multiprocessing's resource
tracker, about 1 GB each) running with nobody to stop it.

`Reaper.start()` starts `python -m workers.reaper` beside the calling process, joined to it
by a pipe whose write end only the caller holds. The reaper keeps a list of the caller's
descendants, refreshed every `REFRESH_S` (once the caller is dead its children belong to
another parent and can no longer be found from it). When the pipe ends without a word, the
caller is gone: the reaper SIGTERMs every descendant it knows of, SIGKILLs those still alive
after `GRACE_S`, and exits. `Reaper.release()` is the word: the caller stopped its children
itself, and the reaper exits touching nothing.

Why not PR_SET_PDEATHSIG: it is set in the child, and vLLM starts its processes itself (and
Linux sends it when the creating thread ends, not the process)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

import psutil

REFRESH_S = 0.5
GRACE_S = 10.0  # an EngineCore SIGTERMed stops its worker and exits in a few seconds
RELEASED = b"."  # the caller's word on the pipe
STARTED = b"+"  # the reaper's, on its stdout, once it has its first list
STARTED_WITHIN_S = 30.0


class Reaper:
    """The caller's handle on its reaper process."""

    def __init__(self, process: subprocess.Popen, writer: int) -> None:
        self.process = process
        self._writer: int | None = writer

    @classmethod
    def start(cls, *, grace_s: float = GRACE_S, refresh_s: float = REFRESH_S) -> Reaper:
        # os.pipe's ends are close-on-exec: the reaper gets the read end alone, and no process
        # started later holds the write end open after the caller dies.
        reader, writer = os.pipe()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "workers.reaper", str(os.getpid()), str(reader), str(grace_s), str(refresh_s)],
                pass_fds=(reader,), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        except BaseException:
            os.close(writer)
            raise
        finally:
            os.close(reader)
        reaper = cls(process, writer)
        # It says when it has its first list: whatever the caller started before is covered.
        with process.stdout:
            ready = _readable(process.stdout, STARTED_WITHIN_S)
            if not (ready and process.stdout.read(1) == STARTED):
                reaper.release()
                raise RuntimeError(f"the reaper did not start within {STARTED_WITHIN_S:g} s")
        return reaper

    @property
    def pid(self) -> int:
        return self.process.pid

    def release(self, timeout_s: float = 5.0) -> None:
        """The caller's children are stopped: the reaper exits without ending any. Idempotent."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                os.write(writer, RELEASED)
            except BrokenPipeError:  # the reaper is gone already
                pass
            finally:
                os.close(writer)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def watch(pid: int, reader: int, *, grace_s: float = GRACE_S, refresh_s: float = REFRESH_S) -> list[int]:
    """Runs in the reaper: follows `pid`'s descendants until the pipe at `reader` ends, and
    ends them unless the caller released it first. Returns the pids it ended."""
    known: dict[int, psutil.Process] = {}
    try:
        watched: psutil.Process | None = psutil.Process(pid)
    except psutil.NoSuchProcess:
        watched = None
    watched = _refresh(known, watched)
    _say_started()
    while True:
        ready = _readable(reader, refresh_s)
        if ready:
            said = os.read(reader, 1)
            if said == RELEASED:
                return []
            if not said:  # end of file: the caller died without a word
                return reap(known.values(), grace_s=grace_s)
        watched = _refresh(known, watched)


def _say_started() -> None:
    os.write(1, STARTED)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # nobody reads this pipe after the first byte
    os.close(devnull)


def _refresh(known: dict[int, psutil.Process], watched: psutil.Process | None) -> psutil.Process | None:
    """Adds `watched`'s descendants to `known` and drops those that ended. Merged, not
    replaced: a dying caller's children leave its list before the pipe says it died."""
    for pid in [pid for pid, process in known.items() if not _alive(process)]:
        del known[pid]
    if watched is None:
        return None
    try:
        children = watched.children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    me = os.getpid()
    for child in children:
        if child.pid != me:
            known[child.pid] = child  # a newer process object, should the pid have been reused
    return watched


def reap(processes: Iterable[psutil.Process], *, grace_s: float = GRACE_S) -> list[int]:
    """SIGTERMs `processes` and their descendants (started since the last refresh), SIGKILLs
    those still alive after `grace_s`. Returns the pids signalled."""
    found: dict[int, psutil.Process] = {}
    for process in processes:
        try:
            for one in [process, *process.children(recursive=True)]:
                found[one.pid] = one
        except psutil.NoSuchProcess:
            pass
    alive = [p for p in found.values() if _alive(p)]
    _signal(alive, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _alive(p)]
    _signal(alive, signal.SIGKILL)
    return sorted(found)


def _signal(processes: list[psutil.Process], sig: int) -> None:
    for process in processes:
        try:
            process.send_signal(sig)  # psutil refuses a pid that now names another process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


def _alive(process: psutil.Process) -> bool:
    # An orphan that exited stays a zombie until its new parent waits for it: it holds nothing.
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main(argv: list[str]) -> int:
    pid, reader, grace_s, refresh_s = int(argv[0]), int(argv[1]), float(argv[2]), float(argv[3])
    # The reaper outlives whatever interrupts its caller's process group: it ends when the
    # caller says so or when the caller is gone, never before.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ended = watch(pid, reader, grace_s=grace_s, refresh_s=refresh_s)
    if ended:
        print(f"ledgerlm reaper: process {pid} died; ended the processes it left: {ended}", file=sys.stderr,
              flush=True)
    return 0


def _readable(source, timeout_s: float) -> bool:
    """Whether `source` (a file or a descriptor) has something to read within `timeout_s`.
    poll, not select: a long-lived process may hold descriptors past select's limit (1024)."""
    poller = select.poll()
    poller.register(source, select.POLLIN | select.POLLHUP)
    return bool(poller.poll(timeout_s * 1000))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

