"""Pytest plugin for the projection and audit tests: fresh projection databases on real
PostgreSQL and on SQLite, fresh event logs on real Kafka and embedded, and a helper that
runs every projection to the end of a log.

A missing LEDGERLM_TEST_POSTGRES or LEDGERLM_TEST_KAFKA fails the tests that need it.
"""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

from models.settings import Settings
from pipelines.signing import HmacSigner
from pipelines.bootstrap import Bootstrap
from pipelines.eventlog import EventLog
from pipelines.eventlog.kafka_clients import close_all
from pipelines.projections import all_projections
from pipelines.projections.runner import ProjectionRunner
from tests.conftest import drop_postgres_databases, make_log_opener, new_postgres_database
from tests.db_templates import migrated_postgres, migrated_sqlite

SIGNER = HmacSigner(b"test-audit-key")
EVERY = 10  # a signed checkpoint every 10 records per partition, so small logs get several


class Databases:
    """Hands out new databases of one kind; drops the PostgreSQL ones afterwards."""

    def __init__(self, kind: str, tmp_path: Path):
        self.kind, self._tmp, self._created = kind, tmp_path, []

    def new(self, *, migrate: bool = True) -> str:
        """A new database, empty or at the migrations' head (a copy of the session's
        migrated template: `tests.db_templates`)."""
        if self.kind == "sqlite":
            path = self._tmp / ("projections-" + uuid.uuid4().hex[:8] + ".db")
            return migrated_sqlite(path) if migrate else f"sqlite:///{path}"
        url, name = migrated_postgres("ledger_") if migrate else new_postgres_database("ledger_")
        self._created.append(name)
        return url

    def drop_all(self) -> None:
        if self._created:
            drop_postgres_databases(self._created)


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_dbs(request, tmp_path) -> Databases:
    dbs = Databases(request.param, tmp_path)
    yield dbs
    dbs.drop_all()


def log_opener(kind: str, tmp_path: Path) -> Callable[[], EventLog]:
    """Opens handles onto one fresh log; `.spec` says how another process opens it."""
    opener = make_log_opener(kind, tmp_path)
    opener.spec = f"{opener.settings.event_log_url}#{opener.settings.event_log_namespace}"
    return opener


def open_spec(spec: str) -> EventLog:
    url, _, namespace = spec.partition("#")
    home = Path(url[len("sqlite:///"):]).parent if url.startswith("sqlite:///") else Path(".")
    return Bootstrap(Settings(home=home, event_log_url=url, event_log_namespace=namespace)).event_log(
        create_topics=False)


def closed_after(opener: Callable[[], EventLog]) -> Iterator[Callable[[], EventLog]]:
    """`opener` for a fixture to yield: every handle it opens is closed when the test ends
    (closing one the test closed already does nothing)."""
    handles: list[EventLog] = []

    def open_handle() -> EventLog:
        handles.append(opener())
        return handles[-1]
    open_handle.spec, open_handle.settings = opener.spec, opener.settings
    yield open_handle
    close_all(handle.close for handle in handles)


@pytest.fixture(params=["embedded", "kafka"])
def ledger_log(request, tmp_path) -> Iterator[Callable[[], EventLog]]:
    yield from closed_after(log_opener(request.param, tmp_path))


@pytest.fixture
def embedded_ledger_log(tmp_path) -> Iterator[Callable[[], EventLog]]:
    yield from closed_after(log_opener("embedded", tmp_path))


def runner_for(log: EventLog, url: str, *, batch_events: int = 500, projections=None) -> ProjectionRunner:
    engine = Bootstrap(Settings(database_url=url)).projection_db()
    return ProjectionRunner(log, engine, projections or all_projections(SIGNER, checkpoint_every=EVERY),
                            batch_events=batch_events)


def project(log: EventLog, url: str, *, batch_events: int = 500) -> ProjectionRunner:
    """Runs every projection of `url` up to the end of `log`; returns the runner."""
    runner = runner_for(log, url, batch_events=batch_events)
    runner.run_until_caught_up()
    return runner
