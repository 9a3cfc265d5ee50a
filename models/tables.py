"""SQL tables. Every row here is a projection of the log (invariant 1): it can be dropped
and rebuilt by replay. Each projection's input positions live beside its rows."""
from __future__ import annotations

from sqlalchemy import BigInteger, Column, DateTime, Integer, MetaData, String, Table

metadata = MetaData(naming_convention={
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
})

# Where each projection has read up to, written in the same transaction as its rows.
checkpoints = Table(
    "projection_checkpoints", metadata,
    Column("projection", String(64), primary_key=True),
    Column("topic", String(200), primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("next_offset", BigInteger, nullable=False),
)

# Status of each generation, as the request, ledger and outcome events tell it.
generations = Table(
    "generations", metadata,
    Column("request_id", String(128), primary_key=True),
    Column("tenant_id", String(64), nullable=False, index=True),
    Column("application_id", String(128), nullable=False),
    Column("model_alias", String(128), nullable=False),
    Column("model_revision", String(200), nullable=False),
    Column("status", String(32), nullable=False),
    Column("finish_reason", String(32)),
    Column("input_tokens", Integer, nullable=False, default=0),
    Column("output_tokens", Integer, nullable=False, default=0),
    Column("cost_micros", BigInteger, nullable=False, default=0),
    Column("queued_ms", Integer),
    Column("ttft_ms", Integer),
    Column("duration_ms", Integer),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True)),
)
