"""Alembic environment: the target is `models.tables.metadata`; the URL comes from the
caller (`ledgerlm db upgrade` passes the settings' database URL)."""
from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from models.tables import metadata

config = context.config


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is None:
        connectable = engine_from_config(config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
                                         poolclass=pool.NullPool)
        with connectable.connect() as connection:
            _run(connection)
    else:
        _run(connectable)


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
