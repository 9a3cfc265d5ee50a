"""`ledgerlm db upgrade` on PostgreSQL and SQLite, and a full down-and-up cycle."""
from __future__ import annotations

import subprocess
import sys
import uuid

import sqlalchemy as sa

from migrations.runner import downgrade, upgrade
from models.tables import metadata


def fresh_postgres_database(admin_url: str) -> str:
    name = "mig_" + uuid.uuid4().hex[:10]
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return admin_url.rsplit("/", 1)[0] + "/" + name


def tables_of(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade_on_postgres(postgres_url):
    url = fresh_postgres_database(postgres_url)
    upgrade(url)
    assert tables_of(url) == set(metadata.tables)
    downgrade(url)
    assert tables_of(url) == set()
    upgrade(url)
    assert tables_of(url) == set(metadata.tables)


def test_migrated_schema_matches_the_models(postgres_url):
    """No drift: autogenerate against a migrated database finds nothing to change."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    url = fresh_postgres_database(postgres_url)
    upgrade(url)
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    assert diff == []


def test_cli_db_upgrade_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    result = subprocess.run([sys.executable, "-m", "api.cli", "db", "upgrade"], capture_output=True, text=True,
                            env={"LEDGERLM_DATABASE_URL": url, "PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert tables_of(url) == set(metadata.tables)
