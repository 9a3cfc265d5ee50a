"""Every request sees every admin change written before it arrived (a revoked key is refused
at once), yet requests arriving together share one look at the admin topic's end instead of
queueing for one each. Both event logs; a look can be held open so callers overlap."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from pipelines.admin.commands import RegistryView
from tests.conftest import make_log_opener
from tests.harness import new_tenant
from tests.helpers import wait_until


class CountingLock:
    """The view's lock, counting the callers that came to it. A caller takes the time it
    asked before it comes to the lock, so once counted, a look begun later covers it."""

    def __init__(self, lock):
        self._lock, self._count_lock, self.arrived = lock, threading.Lock(), 0

    def __enter__(self):
        with self._count_lock:
            self.arrived += 1
        return self._lock.__enter__()

    def __exit__(self, *exc):
        return self._lock.__exit__(*exc)

    def acquire(self, timeout: float = -1) -> bool:
        with self._count_lock:
            self.arrived += 1
        return self._lock.acquire(timeout=timeout)

    def release(self) -> None:
        self._lock.release()


@dataclass
class Views:
    view: RegistryView  # the one under test, whose looks can be held open
    writer: RegistryView  # another, on a handle of its own, for writing changes meanwhile
    gate: threading.Event  # cleared: a look, once it has the end, waits for it to be set
    looking: threading.Event  # set once a look has the end
    lock: CountingLock  # the view's lock: how many callers came to it

    def wait_for_callers(self, since: int, callers: int) -> None:
        """Until `callers` more than `since` are at the lock, held up by the look under way."""
        wait_until(lambda: self.lock.arrived - since >= callers, 30,
                   what=f"{callers} callers to wait for the held look to end")


@pytest.fixture(params=["embedded", "kafka"])
def views(request, tmp_path, monkeypatch):
    opener = make_log_opener(request.param, tmp_path)
    log, writer_log = opener(), opener()
    view, writer = RegistryView(log), RegistryView(writer_log)
    view.refresh()  # the tail exists from here on
    tail = view._tail  # noqa: SLF001
    asks_end = tail.end_offsets
    gate, looking = threading.Event(), threading.Event()
    gate.set()

    def held_end():
        end = asks_end()
        looking.set()
        assert gate.wait(30), "the test never let the look finish"
        return end
    monkeypatch.setattr(tail, "end_offsets", held_end)
    lock = CountingLock(view._lock)  # noqa: SLF001
    monkeypatch.setattr(view, "_lock", lock)
    try:
        yield Views(view, writer, gate, looking, lock)
    finally:
        gate.set()
        for closable in (view, writer, log, writer_log):
            closable.close()


def start_refreshes(view: RegistryView, callers: int) -> tuple[list, list[threading.Thread]]:
    seen: list = [None] * callers

    def call(i: int) -> None:
        seen[i] = view.refresh()
    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(callers)]
    for thread in threads:
        thread.start()
    return seen, threads


def join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)


def hold_a_look(views: Views) -> list[threading.Thread]:
    """A refresh whose look has the end and now waits for the gate."""
    views.gate.clear()
    views.looking.clear()
    _, first = start_refreshes(views.view, 1)
    assert views.looking.wait(30)
    return first


def test_callers_that_arrive_during_a_look_share_the_next_one(views):
    tenant_id, _ = new_tenant(views.writer)
    first = hold_a_look(views)
    before, arrived = views.view.checks, views.lock.arrived
    seen, waiting = start_refreshes(views.view, 12)
    views.wait_for_callers(arrived, 12)
    views.gate.set()
    join(first + waiting)
    # The twelve asked after the held look began, so it cannot answer for them; one look
    # after it, begun after every one of them asked, answers for all.
    assert views.view.checks - before == 1, f"{views.view.checks - before} looks for 12 callers"
    assert all(tenant_id in registry.tenants for registry in seen)


def test_a_caller_never_gets_an_answer_from_a_look_older_than_its_question(views):
    first = hold_a_look(views)  # this look has the end from before the change below
    tenant_id, secret = new_tenant(views.writer)
    arrived = views.lock.arrived
    seen, waiting = start_refreshes(views.view, 1)
    views.wait_for_callers(arrived, 1)
    views.gate.set()
    join(first + waiting)
    assert tenant_id in seen[0].tenants
    assert seen[0].authenticate(secret).tenant_id == tenant_id


def test_a_caller_that_comes_alone_looks_for_itself(views):
    before = views.view.checks
    for _ in range(3):
        views.view.refresh()
    assert views.view.checks - before == 3
    tenant_id, _ = new_tenant(views.writer)
    assert tenant_id in views.view.refresh().tenants
