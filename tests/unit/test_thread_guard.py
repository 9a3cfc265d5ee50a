"""The guard that fails a test module leaving Kafka client threads running (tests/thread_guard.py)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

from tests.helpers import ROOT
from tests.thread_guard import Owners, left_behind

RELEASE = threading.Event()


def _blocked(owners: Owners, owner: str, name: str) -> threading.Thread:
    with owners.owned_by(owner):
        thread = threading.Thread(target=RELEASE.wait, args=(30,), name=name, daemon=True)
        owners.started(thread)
    thread.start()
    return thread


def test_a_module_is_told_which_of_its_client_threads_outlived_it():
    owners = Owners()
    RELEASE.clear()
    threads = [_blocked(owners, "tests/a.py", name) for name in ("kafka-io-ledgerlm-admin", "ledgerlm-network-thread",
                                                                 "stream-hub", "unrelated")]
    threads.append(_blocked(owners, "tests/b.py", "kafka-io-ledgerlm-reader"))
    try:
        problem = left_behind(owners, "tests/a.py", wait_s=0.1, allowed=0)
        assert problem is not None and problem.startswith("tests/a.py left 3 Kafka client threads")
        assert "kafka-io-ledgerlm-admin, ledgerlm-network-thread, stream-hub." in problem
        assert left_behind(owners, "tests/a.py", wait_s=0.1, allowed=3) is None
    finally:
        RELEASE.set()
    assert left_behind(owners, "tests/a.py", wait_s=5, allowed=0) is None
    assert left_behind(owners, "tests/b.py", wait_s=5, allowed=0) is None


def test_a_thread_started_by_an_owned_thread_has_its_owner():
    owners = Owners()
    RELEASE.clear()
    inner: list[threading.Thread] = []

    def start_a_client():
        thread = threading.Thread(target=RELEASE.wait, args=(30,), name="kafka-io-ledgerlm-tail", daemon=True)
        owners.started(thread)
        thread.start()
        inner.append(thread)

    owners.current = "tests/c.py"
    starter = threading.Thread(target=start_a_client)
    with owners.owned_by("the session"):
        owners.started(starter)
    starter.start()
    starter.join(5)
    try:
        assert left_behind(owners, "tests/c.py", wait_s=0.1, allowed=0) is None
        assert "kafka-io-ledgerlm-tail" in left_behind(owners, "the session", wait_s=0.1, allowed=0)
    finally:
        RELEASE.set()


def opens_a_client(self, owners: Owners, name: str) -> threading.Thread:
    """Starts a client thread as code of `self` (a log, or anything else) would."""
    thread = threading.Thread(target=RELEASE.wait, args=(30,), name=name, daemon=True)
    owners.started(thread)
    thread.start()
    return thread


def test_a_client_a_log_opens_later_belongs_to_whoever_opened_the_log():
    from pipelines.eventlog.kafka import KafkaEventLog

    owners = Owners()
    RELEASE.clear()
    log = KafkaEventLog.__new__(KafkaEventLog)  # no broker: only which log it is matters here
    try:
        with owners.owned_by("the session"):
            opens_a_client(log, owners, "kafka-io-t-admin")  # as the log opens
        owners.current = "tests/d.py"
        opens_a_client(log, owners, "kafka-io-t-reader")  # a test reads through the session's log
        opens_a_client(object(), owners, "kafka-io-raw")  # a client of the test's own
        problem = left_behind(owners, "tests/d.py", wait_s=0.1, allowed=0)
        assert problem.startswith("tests/d.py left 1 Kafka client threads") and ": kafka-io-raw." in problem
        assert "kafka-io-t-admin, kafka-io-t-reader." in left_behind(owners, "the session", wait_s=0.1, allowed=0)
    finally:
        RELEASE.set()


LEAKY = '''
import threading
import pytest

STOP = threading.Event()

@pytest.fixture(scope="module")
def clients():
    threads = [threading.Thread(target=STOP.wait, name=f"kafka-io-leaky-{i}", daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    yield threads  # never stopped

def test_uses_clients(clients):
    assert len(clients) == 3
'''

CLEAN = '''
import threading
import pytest

@pytest.fixture(scope="module")
def client():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="kafka-io-clean", daemon=True)
    thread.start()
    yield thread
    stop.set()

def test_uses_a_client(client, session_client):
    assert client.is_alive() and session_client.is_alive()
'''

CONFTEST = '''
import threading
import pytest
import tests.thread_guard

tests.thread_guard.WAIT_S = 0.5

@pytest.fixture(scope="session")
def session_client():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="kafka-io-session", daemon=True)
    thread.start()
    yield thread
    stop.set()
'''


def test_a_pytest_run_reports_the_module_that_leaked_and_passes_the_one_that_closed(tmp_path):
    for name, text in (("pytest.ini", "[pytest]\n"), ("conftest.py", CONFTEST), ("test_clean.py", CLEAN),
                       ("test_leaky.py", LEAKY)):
        (tmp_path / name).write_text(textwrap.dedent(text))
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.thread_guard", "-p", "no:cacheprovider",
                          "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"), "-q", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "2 passed, 1 error" in out, out
    assert "ERROR at teardown of test_uses_clients" in out, out
    assert ("test_leaky.py left 3 Kafka client threads running 0.5 s after its teardown (at most 2 allowed): "
            "kafka-io-leaky-0, kafka-io-leaky-1, kafka-io-leaky-2") in out, out
    assert "test_clean.py left" not in out and "kafka-io-session" not in out, out
