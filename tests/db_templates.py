"""Migrated projection databases, made by copying a template instead of migrating each one.

The first test of a session that asks for a migrated database of a kind migrates one
template to head; every later one is a copy of it: `CREATE DATABASE ... TEMPLATE` on
PostgreSQL, SQLite's backup API on SQLite. Nine migrations per test become one copy.
The migrations themselves are still run and checked, step by step, by
tests/integration/test_migrations.py. tests/conftest.py drops the templates when the
session ends.
"""
from __future__ import annotations

import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

from migrations.runner import upgrade
from tests.conftest import drop_postgres_databases, new_postgres_database

_lock = threading.Lock()
_postgres: list[str] = []  # the session's PostgreSQL template, once made
_sqlite: list[Path] = []  # the session's SQLite template file, once made


def _postgres_template() -> str:
    with _lock:
        if not _postgres:
            url, name = new_postgres_database("tmpl_ledger_")
            try:
                upgrade(url)  # its connections are closed when it returns: a template must have none
            except BaseException:
                drop_postgres_databases([name])
                raise
            _postgres.append(name)
        return _postgres[0]


def migrated_postgres(prefix: str) -> tuple[str, str]:
    """A new PostgreSQL database at the migrations' head: (its URL, its name)."""
    return new_postgres_database(prefix, template=_postgres_template())


def _sqlite_template() -> Path:
    with _lock:
        if not _sqlite:
            path = Path(tempfile.mkdtemp(prefix="ledgerlm-tmpl-")) / "template.db"
            upgrade(f"sqlite:///{path}")
            _sqlite.append(path)
        return _sqlite[0]


def migrated_sqlite(path: Path) -> str:
    """A new SQLite database file at `path`, at the migrations' head; its URL."""
    source, target = sqlite3.connect(_sqlite_template()), sqlite3.connect(path)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    return f"sqlite:///{path}"


def drop_templates() -> None:
    """Drops the session's templates, if it made any."""
    with _lock:
        if _postgres:
            drop_postgres_databases(_postgres)
        for path in _sqlite:
            shutil.rmtree(path.parent, ignore_errors=True)
        _postgres.clear()
        _sqlite.clear()
