"""Shared fixtures: real services from the environment (never skipped when missing),
the one vLLM engine of the session, and a whole platform per event-log adapter. Each test
is marked with its lane and the services it needs, derived from its fixtures (`tests.lanes`)."""
from __future__ import annotations

import os
import sys
import uuid
from functools import partial
from pathlib import Path

import pytest

from models.settings import Settings
from pipelines.bootstrap import Bootstrap
from pipelines.eventlog.kafka_clients import close_all
from tests import lanes

pytest_plugins = ["tests.engine_fixture", "tests.kafka_cleanup", "tests.integration.conftest_ledger",
                  "tests.thread_guard"]

SERVICE_VARS = {
    "kafka": "LEDGERLM_TEST_KAFKA",
    "postgres": "LEDGERLM_TEST_POSTGRES",
    "redis": "LEDGERLM_TEST_REDIS",
    "s3": "LEDGERLM_TEST_S3",
    "prometheus": "LEDGERLM_TEST_PROMETHEUS",
}
_running: list[pytest.Item] = []  # the test being set up or run, for `service_url` to check


def pytest_collection_modifyitems(config, items):
    """Marks each test with its lane and services (`tests.lanes`), and refuses a suite in
    which a lane's target would not start a service one of its tests needs."""
    problems = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        marks = lanes.service_marks(item.fixturenames, callspec.params if callspec else {})
        lane = lanes.lane_of(item.nodeid.split("::")[0], item.fixturenames)
        for name in sorted(marks) + [lane]:
            item.add_marker(name)
        item.user_properties.append(("lane", lane))  # in the junit XML, for tests/durations_report.py
        if missing := lanes.unstarted(lane, marks):
            problems.append(f"{item.nodeid} needs {', '.join(sorted(missing))}, which lane {lane} does not start")
    if problems:
        raise pytest.UsageError("tests/lanes.py: " + "; ".join(problems[:10]))


def pytest_sessionfinish(session):
    templates = sys.modules.get("tests.db_templates")  # imported only by a session that made one
    if templates is not None:
        templates.drop_templates()


def _while_running(item):
    """Hook wrapper: `item` is the test running while its setup or call does."""
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


pytest_runtest_setup = pytest.hookimpl(wrapper=True)(_while_running)
pytest_runtest_call = pytest_runtest_setup


def service_url(name: str) -> str:
    """The URL of a real service started by `infra/services.sh up`. A missing one fails
    the test loudly: these tests exist to run against the real thing. So does a test that
    reaches a service its markers do not name, since its lane would not start it."""
    if _running and _running[-1].get_closest_marker(name) is None:
        pytest.fail(f"{_running[-1].nodeid} uses {name} but is not marked {name}: request a fixture "
                    f"that says so (tests/lanes.py FIXTURE_MARKS)", pytrace=False)
    var = SERVICE_VARS[name]
    value = os.environ.get(var)
    if not value:
        pytest.fail(f"{var} is not set: start the services with `make services-up` and source "
                    f".local/services.env (or run `make test`)", pytrace=False)
    return value


def new_postgres_database(prefix: str, *, template: str = "") -> tuple[str, str]:
    """A new database on the real PostgreSQL, empty or a copy of `template`: (its URL, its name)."""
    import sqlalchemy as sa
    server_url = service_url("postgres")
    name = prefix + uuid.uuid4().hex[:12]
    server = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with server.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    server.dispose()
    return server_url.rsplit("/", 1)[0] + "/" + name, name


def drop_postgres_databases(names) -> None:
    """Drops databases `new_postgres_database` made, connections and all."""
    import sqlalchemy as sa
    server = sa.create_engine(service_url("postgres"), isolation_level="AUTOCOMMIT")
    with server.connect() as conn:
        for name in names:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    server.dispose()


@pytest.fixture(scope="session")
def kafka_url() -> str:
    return service_url("kafka")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    return service_url("postgres")


@pytest.fixture(scope="session")
def redis_url() -> str:
    return service_url("redis")


@pytest.fixture(scope="session")
def s3_endpoint() -> str:
    return service_url("s3")


@pytest.fixture(scope="session")
def prometheus_url() -> str:
    return service_url("prometheus")


@pytest.fixture
def own_vllm() -> None:
    """Asked for by a test that starts real vLLM engines of its own (in this process or a
    child) rather than using the session's, so it is marked `vllm` as those are."""


def isolated_log_settings(kind: str, home: Path, *, prefix: str = "t") -> Settings:
    """Settings naming one isolated log: the embedded one under `home`, or a new namespace
    (`prefix` + random) on the real Kafka."""
    if kind == "embedded":
        return Settings(home=home, event_log_url=f"sqlite:///{Path(home) / 'eventlog.db'}", event_log_namespace="")
    return Settings(home=home, event_log_url=service_url("kafka"), event_log_namespace=prefix + uuid.uuid4().hex[:12])


def make_log_opener(kind: str, tmp_dir: Path, *, prefix: str = "t"):
    """A function opening fresh handles onto one isolated log of the given adapter, its
    topics made; its `.settings` name the log, for another process to open it."""
    platform = Bootstrap(isolated_log_settings(kind, tmp_dir, prefix=prefix))
    platform.event_log().close()
    opener = partial(platform.event_log, create_topics=False)
    opener.settings = platform.settings
    return opener


@pytest.fixture(params=["embedded", "kafka"])
def log_handles(request, tmp_path):
    """`log_handles()`: a fresh handle onto one isolated log per test, on each adapter in
    turn; every handle given out is closed with the test."""
    opener = make_log_opener(request.param, tmp_path)
    handles = []

    def fresh():
        handles.append(opener())
        return handles[-1]
    yield fresh
    for handle in handles:
        handle.close()


@pytest.fixture(scope="session")
def platforms(engine_runner, tmp_path_factory):
    """`platforms(kind, admit=False)`: the whole platform on that event-log adapter, made on
    first use and shared by the tests of a session. With `admit`, admission runs in the
    worker's process (`serve worker --admit`)."""
    from tests.harness import Platform
    from tests.thread_guard import session_owned

    made: dict[tuple[str, bool], object] = {}

    def get(kind: str, admit: bool = False):
        if (kind, admit) not in made:
            home = tmp_path_factory.mktemp(f"platform-{kind}{'-admit' if admit else ''}")
            # A loaded host can keep admission from deciding within the deployed 5 s; these
            # platforms test what is decided, so the API waits longer before its 503.
            settings = Settings(home=home, grace_s=5.0, default_deadline_ms=60_000, decision_timeout_s=20.0)
            with session_owned():  # built by the first test that asks, closed with the session
                plat = Platform(make_log_opener(kind, home), engine_runner, settings, worker_admits=admit)
            plat.kind = kind
            made[kind, admit] = plat
        return made[kind, admit]
    yield get
    close_all(plat.close for plat in made.values())


@pytest.fixture(scope="session", params=["embedded", "kafka"])
def platform(request, platforms):
    """The whole platform on each event-log adapter, shared by the tests of a session."""
    return platforms(request.param)


def platform_both_ways():
    """A module's `platform` fixture (`platform = platform_both_ways()`) that runs its tests
    on both deployments of each log: admission a process of its own, and admission in the
    worker (`-admit` in the test id)."""
    @pytest.fixture(scope="module", params=["embedded", "kafka", "embedded-admit", "kafka-admit"])
    def platform(request, platforms):
        kind, _, admit = request.param.partition("-")
        return platforms(kind, admit=bool(admit))
    return platform
