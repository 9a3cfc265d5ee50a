"""Runs Alembic from code, so `ledgerlm db upgrade` needs no alembic.ini on disk."""
from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

HERE = Path(__file__).parent


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def _prepare(database_url: str) -> None:
    if database_url.startswith("sqlite:///"):
        Path(database_url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)


def upgrade(database_url: str, revision: str | None = None) -> None:
    _prepare(database_url)
    command.upgrade(alembic_config(database_url), revision or "head")


def downgrade(database_url: str, revision: str | None = None) -> None:
    command.downgrade(alembic_config(database_url), revision or "base")


def revision(database_url: str, message: str) -> None:
    """Autogenerates a new revision against the database at `database_url` (at head)."""
    command.revision(alembic_config(database_url), message=message, autogenerate=True)
