"""The projection database: opening it, and the few bulk statements projections need,
written once for PostgreSQL and SQLite.

Everything here takes rows for a whole batch of events, so a batch costs a handful of
statements, not one per event.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

from sqlalchemy import Connection, DateTime, Engine, Table, create_engine, event, text, tuple_

IN_CHUNK = 500  # keys per IN list: well under SQLite's bound-variable limit
SMALL = 50  # rows up to which PostgreSQL gets one INSERT ... VALUES rather than a staged COPY


def open_projection_db(url: str, **options) -> Engine:
    """An engine on `url` (postgresql+psycopg://... or sqlite:///...)."""
    if not url.startswith("sqlite"):
        engine = create_engine(url, pool_pre_ping=True, **options)

        @event.listens_for(engine, "commit")
        def _committed(conn):
            conn.info.pop("ledger_used", None)  # ON COMMIT DELETE ROWS emptied the staging tables

        @event.listens_for(engine, "rollback")
        def _rolled_back(conn):
            # Tables created in the rolled-back transaction are gone with it.
            conn.info.pop("ledger_used", None)
            conn.info.pop("ledger_stages", None)

        return engine
    path = url.split("///", 1)[-1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": 30}, **options)

    # SQLAlchemy's recipe for real SQLite transactions: the driver's own handling would
    # start them only at the first write, after the runner has read the rows it merges.
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _):
        dbapi_conn.isolation_level = None
        dbapi_conn.execute("PRAGMA journal_mode=WAL")  # readers (the API) never block the runner
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")
        dbapi_conn.execute("PRAGMA busy_timeout=30000")

    @event.listens_for(engine, "begin")
    def _begin(conn):
        # Writers ask for the write lock up front, so two runners serialize instead of failing.
        mode = "IMMEDIATE" if conn.get_execution_options().get("sqlite_write") else "DEFERRED"
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def is_postgres(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def key_columns(table: Table) -> list[str]:
    return [c.name for c in table.primary_key.columns]


def _q(name: str) -> str:
    return f'"{name}"'


def _copy(conn: Connection, target: str, columns: Sequence[str], rows: Iterable[Sequence]) -> None:
    cursor = conn.connection.driver_connection.cursor()
    with cursor, cursor.copy(f"COPY {_q(target)} ({', '.join(map(_q, columns))}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def _merge(conn: Connection, table: Table, rows: Sequence[dict], on_conflict: str) -> None:
    """INSERT ... ON CONFLICT for a batch of rows, the same SQL on both databases.

    PostgreSQL: the rows are COPied into a session-private staging table, then one
    INSERT ... SELECT; much faster than a statement per row. SQLite: one executemany
    straight to the driver, times written the way SQLAlchemy's DateTime stores them;
    SQLAlchemy's per-value processing would cost more than the insert itself.
    """
    cols = [c.name for c in table.columns]
    names = ", ".join(map(_q, cols))
    conflict = f"ON CONFLICT ({', '.join(map(_q, key_columns(table)))}) {on_conflict}"
    if is_postgres(conn):
        values = ([row.get(c) for c in cols] for row in rows)
        if len(rows) <= SMALL:  # a few rows: one multi-row statement beats four round trips
            marks = ", ".join("(" + ", ".join(["%s"] * len(cols)) + ")" for _ in rows)
            conn.exec_driver_sql(f"INSERT INTO {_q(table.name)} ({names}) VALUES {marks} {conflict}",
                                 tuple(v for row in values for v in row))
            return
        stage = f"_stage_{table.name}"
        # Staging tables live as long as the session; ON COMMIT DELETE ROWS empties them.
        created, used = conn.info.setdefault("ledger_stages", set()), conn.info.setdefault("ledger_used", set())
        if stage not in created:
            conn.exec_driver_sql(f"CREATE TEMP TABLE IF NOT EXISTS {_q(stage)} (LIKE {_q(table.name)}) "
                                 "ON COMMIT DELETE ROWS")
            created.add(stage)
        elif stage in used:
            conn.exec_driver_sql(f"TRUNCATE {_q(stage)}")  # used before in this transaction
        used.add(stage)
        _copy(conn, stage, cols, values)
        conn.exec_driver_sql(f"INSERT INTO {_q(table.name)} ({names}) SELECT {names} FROM {_q(stage)} {conflict}")
        return
    conn.exec_driver_sql(f"INSERT INTO {_q(table.name)} ({names}) VALUES ({', '.join('?' * len(cols))}) {conflict}",
                         _sqlite_rows(table, cols, ([row.get(c) for c in cols] for row in rows)))


def _sqlite_rows(table: Table, cols: Sequence[str], rows: Iterable[Sequence]) -> list[tuple]:
    times = {i for i, c in enumerate(cols) if isinstance(table.c[c].type, DateTime)}
    if not times:
        return [tuple(row) for row in rows]
    return [tuple(_sqlite_time(v) if i in times else v for i, v in enumerate(row)) for row in rows]


def upsert(conn: Connection, table: Table, rows: Sequence[dict]) -> None:
    """Inserts rows, replacing every non-key column of rows already there. Keys must be
    distinct within one call."""
    if rows:
        keys = key_columns(table)
        _merge(conn, table, rows, "DO UPDATE SET " + ", ".join(
            f"{_q(c.name)} = EXCLUDED.{_q(c.name)}" for c in table.columns if c.name not in keys))


def insert_new(conn: Connection, table: Table, rows: Sequence[dict]) -> None:
    """Inserts rows whose key is not there yet; rows already there stay as they are."""
    if rows:
        _merge(conn, table, rows, "DO NOTHING")


def add_to(conn: Connection, table: Table, rows: Sequence[dict], counters: Sequence[str]) -> None:
    """Inserts rows, or adds their `counters` to the row already there."""
    if rows:
        _merge(conn, table, rows, "DO UPDATE SET " + ", ".join(
            f"{_q(c)} = {_q(table.name)}.{_q(c)} + EXCLUDED.{_q(c)}" for c in counters))


def _pg_keys(table: Table, keys: list[tuple]) -> tuple[str, str, dict]:
    """An unnest() of one array per key column, joined on the key: one index probe per
    key, and no planning of a thousand-term IN list."""
    cols = key_columns(table)
    arrays = ", ".join(f"CAST(:k{i} AS {'bigint' if table.c[c].type.python_type is int else 'text'}[])"
                       for i, c in enumerate(cols))
    on = " AND ".join(f"t.{_q(c)} = k.k{i}" for i, c in enumerate(cols))
    names = ", ".join(f"k{i}" for i in range(len(cols)))
    params = {f"k{i}": [k[i] for k in keys] for i in range(len(cols))}
    return f"unnest({arrays}) AS k({names})", on, params


def select_by_keys(conn: Connection, table: Table, keys: Iterable[tuple]) -> list[dict]:
    """Rows whose primary key is one of `keys` (tuples in key-column order)."""
    keys = list(keys)
    if not keys:
        return []
    if is_postgres(conn):
        source, on, params = _pg_keys(table, keys)
        result = conn.execute(text(f"SELECT t.* FROM {_q(table.name)} t JOIN {source} ON {on}"), params)
        return [dict(row._mapping) for row in result]
    cols = [table.c[name] for name in key_columns(table)]
    out: list[dict] = []
    for start in range(0, len(keys), IN_CHUNK):
        chunk = keys[start:start + IN_CHUNK]
        where = cols[0].in_([k[0] for k in chunk]) if len(cols) == 1 else tuple_(*cols).in_(chunk)
        out += [dict(row._mapping) for row in conn.execute(table.select().where(where))]
    return out


def delete_by_keys(conn: Connection, table: Table, keys: Iterable[tuple]) -> None:
    keys = list(keys)
    if not keys:
        return
    if is_postgres(conn):
        source, on, params = _pg_keys(table, keys)
        conn.execute(text(f"DELETE FROM {_q(table.name)} t USING {source} WHERE {on}"), params)
        return
    cols = [table.c[name] for name in key_columns(table)]
    for start in range(0, len(keys), IN_CHUNK):
        chunk = keys[start:start + IN_CHUNK]
        where = cols[0].in_([k[0] for k in chunk]) if len(cols) == 1 else tuple_(*cols).in_(chunk)
        conn.execute(table.delete().where(where))


def bulk_insert(conn: Connection, table: Table, columns: Sequence[str], rows: Sequence[tuple]) -> None:
    """Appends rows known to be new. On PostgreSQL through COPY, several times faster
    than INSERT for the audit trail's one row per event."""
    if not rows:
        return
    if is_postgres(conn):
        _copy(conn, table.name, columns, rows)
        return
    conn.exec_driver_sql(f"INSERT INTO {_q(table.name)} ({', '.join(map(_q, columns))}) "
                         f"VALUES ({', '.join('?' * len(columns))})", _sqlite_rows(table, columns, rows))


def _sqlite_time(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc)
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")
