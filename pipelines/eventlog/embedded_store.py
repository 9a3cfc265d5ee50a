"""SQLite storage shared by the embedded log and its group consumers.

Every process opens its own connections to one WAL-mode file. Writers take the write
lock up front (`BEGIN IMMEDIATE`) so two appenders never both read the same next offset
and then collide; readers never block writers in WAL mode.
"""
from __future__ import annotations

import sqlite3
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

from pipelines.eventlog.base import EventLogError, Message, Record, UnknownTopic, partition_for

SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY, partitions INTEGER NOT NULL, retention_ms INTEGER);
CREATE TABLE IF NOT EXISTS partition_ends (
    topic TEXT NOT NULL, partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL, low_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    key TEXT, value BLOB NOT NULL, timestamp_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, partition, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_offsets (
    grp TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_members (
    grp TEXT NOT NULL, member_id TEXT NOT NULL, instance TEXT NOT NULL, topics TEXT NOT NULL,
    heartbeat_ms INTEGER NOT NULL,
    PRIMARY KEY (grp, member_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_state (
    grp TEXT PRIMARY KEY, generation INTEGER NOT NULL, roster TEXT NOT NULL);
"""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class LogConnection(sqlite3.Connection):
    """A connection that remembers how long it may wait for a lock (set by `connect`), and
    the partition counts of the topics it has met: a topic's count never changes once it
    exists (`ensure_topics` only inserts; topics are never dropped), so each is looked up
    once per connection instead of at every append and read."""

    busy_timeout_ms: int
    partition_counts: dict[str, int]


def connect(path: str, *, busy_timeout_ms: int, synchronous: str) -> LogConnection:
    # isolation_level=None: we issue BEGIN/COMMIT ourselves, so transactions stay explicit and short.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                           timeout=busy_timeout_ms / 1000, factory=LogConnection)
    conn.busy_timeout_ms = int(busy_timeout_ms)
    conn.partition_counts = {}
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    conn.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL survives a process crash (not a power cut), like an unflushed Kafka broker.
    conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn


class DataVersion:
    """Whether another connection committed to the database since the last look, by SQLite's
    `PRAGMA data_version` (reads no table). A connection's own commits do not move it."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn, self._seen = conn, None

    def moved(self) -> bool:
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        moved, self._seen = version != self._seen, version
        return moved


# Between tries for the write lock: short, since a holder keeps it for well under a millisecond.
LOCK_RETRY_S = (0.0001, 0.0002, 0.0005, 0.001)


def take_write_lock(conn: LogConnection) -> None:
    """`BEGIN IMMEDIATE`, retried every fraction of a millisecond until the connection's busy
    timeout. SQLite's own busy handler sleeps 1, 2, 5, 10, ... up to 100 ms between tries, so
    with several processes appending steadily a waiter slept on after the lock was free:
    with three appending processes, p99 of an append was 1.1 ms that way and 0.25-0.33 ms
    this way (`tests/perf/bench_write_lock.py`)."""
    timeout_ms = conn.busy_timeout_ms
    deadline = time.monotonic() + timeout_ms / 1000
    conn.execute("PRAGMA busy_timeout=0")
    try:
        tries = 0
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                    raise
            time.sleep(LOCK_RETRY_S[min(tries, len(LOCK_RETRY_S) - 1)])
            tries += 1
    finally:
        conn.execute(f"PRAGMA busy_timeout={timeout_ms}")


@contextmanager
def write_txn(conn: LogConnection) -> Iterator[LogConnection]:
    take_write_lock(conn)
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def create_schema(conn: LogConnection) -> None:
    with write_txn(conn):
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)


def partition_count(conn: LogConnection, topic: str) -> int:
    known = conn.partition_counts.get(topic)
    if known is not None:
        return known
    row = conn.execute("SELECT partitions FROM topics WHERE name = ?", (topic,)).fetchone()
    if row is None:  # not remembered: a later look finds it once someone creates it
        raise UnknownTopic(f"topic {topic!r} does not exist; create it with ensure_topics")
    conn.partition_counts[topic] = row[0]
    return row[0]


def check_partition(conn: LogConnection, topic: str, partition: int) -> None:
    n = partition_count(conn, topic)
    if not 0 <= partition < n:
        raise EventLogError(f"topic {topic!r} has {n} partitions; {partition} is out of range")


def insert_records(conn: LogConnection, outputs: Sequence[tuple[str, Message]]) -> list[Record]:
    """Appends inside the caller's write transaction; returns records in input order."""
    counts: dict[str, int] = {}
    next_offsets: dict[tuple[str, int], int] = {}
    stamp = now_ms()
    records = []
    for topic, message in outputs:
        if topic not in counts:
            counts[topic] = partition_count(conn, topic)
        n = counts[topic]
        partition = partition_for(message.key, n) if message.partition is None else message.partition
        if not 0 <= partition < n:
            raise EventLogError(f"topic {topic!r} has {n} partitions; {partition} is out of range")
        tp = (topic, partition)
        if tp not in next_offsets:
            next_offsets[tp] = conn.execute(
                "SELECT next_offset FROM partition_ends WHERE topic = ? AND partition = ?", tp).fetchone()[0]
        records.append(Record(topic, partition, next_offsets[tp], message.key, bytes(message.value), stamp))
        next_offsets[tp] += 1
    conn.executemany(
        "INSERT INTO records (topic, partition, offset, key, value, timestamp_ms) VALUES (?, ?, ?, ?, ?, ?)",
        [(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp_ms) for r in records])
    conn.executemany("UPDATE partition_ends SET next_offset = ? WHERE topic = ? AND partition = ?",
                     [(end, topic, partition) for (topic, partition), end in next_offsets.items()])
    return records


def select_records(conn: sqlite3.Connection, topic: str, partition: int, offset: int, limit: int) -> list[Record]:
    rows = conn.execute(
        "SELECT offset, key, value, timestamp_ms FROM records"
        " WHERE topic = ? AND partition = ? AND offset >= ? ORDER BY offset LIMIT ?",
        (topic, partition, offset, limit)).fetchall()
    return [Record(topic, partition, o, k, v, ts) for o, k, v, ts in rows]


def committed_offset(conn: sqlite3.Connection, group: str, topic: str, partition: int) -> int | None:
    row = conn.execute("SELECT next_offset FROM group_offsets WHERE grp = ? AND topic = ? AND partition = ?",
                       (group, topic, partition)).fetchone()
    return None if row is None else row[0]


def partition_rows(conn: sqlite3.Connection, table: str, column: str, partitions: Sequence[tuple[str, int]],
                   *, where: str = "", args: Sequence = ()) -> dict[tuple[str, int], int]:
    """`column` of `table` for each of `partitions` that has a row, in one query (`where`
    and `args` narrow it further, e.g. to a group)."""
    topics = sorted({t for t, _ in partitions})
    if not topics:
        return {}
    wanted = set(partitions)
    marks = ", ".join("?" * len(topics))
    rows = conn.execute(f"SELECT topic, partition, {column} FROM {table} WHERE topic IN ({marks}){where}",
                        (*topics, *args)).fetchall()
    return {(t, p): value for t, p, value in rows if (t, p) in wanted}
