"""Fails a test module that leaves Kafka clients running after its teardown.

Every thread is owned by what was running when it started: the test module, or the session
(inside a session-scoped fixture's setup, or a `session_owned()` block for things a session
fixture builds lazily). A thread started by an owned thread has that thread's owner, so a
client opened by a session platform's worker loop is the session's, whichever test's
request made it. A Kafka client that a `KafkaEventLog` opens is owned by whoever opened the
log (its admin client starts with it), so a reader a test makes on a session log is the
session's. After a module's last teardown its client threads (kafka-python's I/O and
sender threads, and our threads that follow the log) are given `WAIT_S` to end, as clients
close asynchronously; more than `ALLOWED_LEFT` still alive is an error naming the module
and the threads.
"""
from __future__ import annotations

import re
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator
from weakref import WeakKeyDictionary

import pytest

# kafka-python names each client's I/O loop `kafka-io-<client_id>` and a producer's sender
# `<client_id>-network-thread`; ours read or write the log (api/stream_hub.py,
# workers/cancel_watch.py, pipelines/admission/lost_workers.py, workers/fleet_presence.py).
CLIENT_THREAD = re.compile(r"^kafka-io-|-network-thread$|^(stream-hub|cancel-watch|admission-fleet)$|-fleet(-left)?$")
SESSION = "the session"
WAIT_S = 10.0
# A closed client's threads end within the wait; a few may lag on a loaded host. A log left
# open holds at least an admin and a reader thread per handle, and leaks come by the handle.
ALLOWED_LEFT = 2
FRAMES_SEARCHED = 40  # from a thread's start up to the log that opens the client


class ModuleLeftClients(AssertionError):
    pass


class Owners:
    """Which module (or the session) each thread started under."""

    def __init__(self):
        self.current: str | None = None  # the module whose tests run now
        self._owner: WeakKeyDictionary[threading.Thread, str | None] = WeakKeyDictionary()
        self._log_owner: WeakKeyDictionary[object, str | None] = WeakKeyDictionary()
        self._lock = threading.Lock()
        self._local = threading.local()  # per thread: the owners `owned_by` blocks name

    def here(self) -> str | None:
        named = getattr(self._local, "stack", None)
        if named:
            return named[-1]
        with self._lock:
            return self._owner.get(threading.current_thread(), self.current)

    def started(self, thread: threading.Thread) -> None:
        owner = self.here()
        log = _opening_log(sys._getframe(1)) if CLIENT_THREAD.search(thread.name) else None
        with self._lock:
            if log is not None:
                owner = self._log_owner.setdefault(log, owner)  # first seen as it opens: its maker's
            self._owner[thread] = owner

    @contextmanager
    def owned_by(self, owner: str) -> Iterator[None]:
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append(owner)
        try:
            yield
        finally:
            stack.pop()

    def clients_of(self, owner: str) -> list[threading.Thread]:
        with self._lock:
            owned = [t for t, o in self._owner.items() if o == owner]
        return [t for t in owned if t.is_alive() and CLIENT_THREAD.search(t.name)]


def _opening_log(frame) -> object | None:
    """The `KafkaEventLog` whose code (or whose tail's or member's) is starting a thread, if any."""
    kafka = sys.modules.get("pipelines.eventlog.kafka")
    if kafka is None:
        return None
    for _ in range(FRAMES_SEARCHED):
        if frame is None:
            return None
        me = frame.f_locals.get("self")
        try:
            mine = object.__getattribute__(me, "__dict__").get("_log")  # no proxy's __getattr__ runs
        except AttributeError:
            mine = None
        for candidate in (me, mine):
            if isinstance(candidate, kafka.KafkaEventLog):
                return candidate
        frame = frame.f_back
    return None


def still_running(threads: list[threading.Thread], timeout_s: float) -> list[threading.Thread]:
    """The threads that have not ended within `timeout_s`, all of them waited on together."""
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t for t in threads if t.is_alive()]


def left_behind(owners: Owners, module: str, *, wait_s: float | None = None, allowed: int | None = None) -> str | None:
    """What is wrong with what `module` left running, or None (`WAIT_S` and `ALLOWED_LEFT`
    are read when called, so a session may set its own)."""
    wait_s = WAIT_S if wait_s is None else wait_s
    allowed = ALLOWED_LEFT if allowed is None else allowed
    left = still_running(owners.clients_of(module), wait_s)
    if len(left) <= allowed:
        return None
    names = ", ".join(sorted(t.name for t in left))
    return (f"{module} left {len(left)} Kafka client threads running {wait_s:g} s after its teardown "
            f"(at most {allowed} allowed): {names}. Close every log, tail, consumer and view it opens.")


_owners = Owners()
_original_start = threading.Thread.start


def _start(self, *args, **kwargs):
    _owners.started(self)  # before it runs: what it starts inherits its owner
    return _original_start(self, *args, **kwargs)


def session_owned():
    """A block whose threads live as long as the session: a session fixture's lazily built part."""
    return _owners.owned_by(SESSION)


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_configure(config):
    threading.Thread.start = _start


def pytest_unconfigure(config):
    threading.Thread.start = _original_start


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.scope != "session":
        return (yield)
    with session_owned():
        return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _owners.current = _module_of(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    __tracebackhide__ = True  # the message says it all; this hook's code is no clue
    failed: BaseException | None = None
    try:
        result = yield
    except Exception as exc:  # the teardown's own failure still goes up, with ours noted
        failed, result = exc, None
    module = _module_of(item)
    problem = None if nextitem is not None and _module_of(nextitem) == module else left_behind(_owners, module)
    if problem and failed is not None:
        failed.add_note(problem)
    if failed is not None:
        raise failed
    if problem:
        raise ModuleLeftClients(problem)
    return result
