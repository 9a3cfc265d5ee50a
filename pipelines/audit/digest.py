"""A digest per projected table: equal digests mean equal rows.

Rows are read in primary-key order (byte order on both databases: PostgreSQL is asked
for the "C" collation) and each is written as canonical JSON with values normalized
across dialects (UTC ISO times, hex bytes), one line per row, into one SHA-256.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import DateTime, Engine, LargeBinary, String, select

from models.events import canonical
from models.tables import PROJECTED_TABLES


@dataclass(frozen=True)
class TableDigest:
    table: str
    rows: int
    sha256: str


def _time(v: datetime | None) -> str | None:
    """UTC, to the microsecond; SQLite hands back naive times, which are UTC here."""
    if v is None:
        return None
    if v.tzinfo is not None:
        v = v.astimezone(timezone.utc).replace(tzinfo=None)
    return v.isoformat(timespec="microseconds") + "Z"


def _hex(v) -> str | None:
    return None if v is None else bytes(v).hex()


def _converters(table) -> list:
    """One function per column (None: the value is written as it comes)."""
    return [_time if isinstance(c.type, DateTime) else _hex if isinstance(c.type, LargeBinary) else None
            for c in table.columns]


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
            convert = _converters(table)
            if not any(convert):
                for row in result:
                    h.update(canonical(list(row)) + b"\n")
                    rows += 1
            else:
                for row in result:
                    h.update(canonical([f(v) if f and v is not None else v for f, v in zip(convert, row)]) + b"\n")
                    rows += 1
            out.append(TableDigest(table.name, rows, h.hexdigest()))
    return out
