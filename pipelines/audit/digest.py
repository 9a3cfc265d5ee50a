"""A digest per projected table: equal digests mean equal rows.

Rows are read in primary-key order (byte order on both databases: PostgreSQL is asked
for the "C" collation) and each is written as canonical JSON with values normalized
across dialects (UTC ISO times, hex bytes), one line per row, into one SHA-256.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import Engine, String, select

from models.events import canonical
from models.tables import PROJECTED_TABLES


@dataclass(frozen=True)
class TableDigest:
    table: str
    rows: int
    sha256: str


def _value(v):
    if isinstance(v, datetime):
        v = v.replace(tzinfo=timezone.utc) if v.tzinfo is None else v.astimezone(timezone.utc)
        return v.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(v, (bytes, memoryview)):
        return bytes(v).hex()
    return v


def table_digests(engine: Engine, tables=PROJECTED_TABLES) -> list[TableDigest]:
    out = []
    with engine.connect() as conn:
        postgres = conn.dialect.name == "postgresql"
        for table in tables:
            order = [c.collate("C") if postgres and isinstance(c.type, String) else c
                     for c in table.primary_key.columns]
            h = hashlib.sha256(canonical([c.name for c in table.columns]) + b"\n")
            rows = 0
            result = conn.execution_options(stream_results=True, yield_per=10_000).execute(
                select(table).order_by(*order))
            for row in result:
                h.update(canonical([_value(v) for v in row]) + b"\n")
                rows += 1
            out.append(TableDigest(table.name, rows, h.hexdigest()))
    return out
