"""A migrated database is a copy of one template migrated once per session (`tests.db_templates`)."""
from __future__ import annotations

import sqlalchemy as sa

from models.tables import metadata
from tests import db_templates


def tables_and_head(url: str) -> tuple[set[str], str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            head = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
        return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}, head
    finally:
        engine.dispose()


def test_sqlite_copies_are_at_head_independent_and_migrated_once(tmp_path, monkeypatch):
    from migrations.runner import upgrade

    runs = []
    monkeypatch.setattr(db_templates, "upgrade", lambda url: (runs.append(url), upgrade(url)))
    monkeypatch.setattr(db_templates, "_sqlite", [])  # this test's own templates, not the session's
    monkeypatch.setattr(db_templates, "_postgres", [])
    first = db_templates.migrated_sqlite(tmp_path / "first.db")
    second = db_templates.migrated_sqlite(tmp_path / "second.db")
    assert len(runs) == 1
    reference = f"sqlite:///{tmp_path / 'reference.db'}"
    upgrade(reference)
    assert tables_and_head(first) == tables_and_head(second) == tables_and_head(reference)
    assert tables_and_head(first)[0] == set(metadata.tables)

    engine = sa.create_engine(first)
    with engine.begin() as conn:  # a row in one copy is in that copy only
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'changed'"))
    engine.dispose()
    assert tables_and_head(second)[1] == tables_and_head(reference)[1]

    template = db_templates._sqlite[0]
    db_templates.drop_templates()
    assert not template.exists() and db_templates._sqlite == []
