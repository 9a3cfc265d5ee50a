"""`EmbeddedEventLog`: the event log in one SQLite file, for one machine and no servers.

Same topics, partitions, offsets and consumer groups as Kafka; several processes may
open the same file. Offsets are dense per partition and never reused: the next offset is
kept in `partition_ends`, so deleting old records (retention) does not rewind it.
"""
from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Iterable, Sequence

from pipelines.eventlog.base import (
    EventLog, GroupConsumer, Message, Record, Tail, TopicPartition, TopicSpec, UnknownTopic,
)
from pipelines.eventlog.embedded_groups import EmbeddedGroupConsumer, GroupOptions, rebalance
from pipelines.eventlog.embedded_store import (
    check_partition, connect, create_schema, insert_records, now_ms, partition_count, partition_rows, select_records,
    write_txn,
)


class EmbeddedEventLog(EventLog):
    def __init__(
        self,
        path: str | Path,
        *,
        session_timeout_s: float = 10.0,
        heartbeat_interval_s: float = 1.0,
        poll_interval_s: float = 0.002,
        busy_timeout_ms: int = 30_000,
        synchronous: str = "NORMAL",
    ):
        self._path = str(path)
        self._busy_timeout_ms = busy_timeout_ms
        self._synchronous = synchronous
        self._poll_interval_s = poll_interval_s
        self._group_options = GroupOptions(session_timeout_s, heartbeat_interval_s, poll_interval_s)
        self._conn = connect(self._path, busy_timeout_ms=busy_timeout_ms, synchronous=synchronous)
        # One connection per log object; the lock lets threads share it (a reader waiting
        # in `read` releases it between polls, so an appender in another thread gets in).
        self._lock = threading.Lock()
        self._consumers: set[EmbeddedGroupConsumer] = set()
        with self._lock:
            create_schema(self._conn)

    def ensure_topics(self, specs: Iterable[TopicSpec]) -> None:
        specs = list(specs)
        with self._lock, write_txn(self._conn):
            for spec in specs:
                if spec.partitions < 1:
                    raise ValueError(f"topic {spec.name!r} needs at least one partition")
                created = self._conn.execute(
                    "INSERT OR IGNORE INTO topics (name, partitions, retention_ms) VALUES (?, ?, ?)",
                    (spec.name, spec.partitions, spec.retention_ms)).rowcount
                if created:
                    self._conn.executemany(
                        "INSERT INTO partition_ends (topic, partition, next_offset, low_offset) VALUES (?, ?, 0, 0)",
                        [(spec.name, p) for p in range(spec.partitions)])

    def partitions(self, topic: str) -> int:
        with self._lock:
            return partition_count(self._conn, topic)

    def append(self, topic: str, messages: Sequence[Message]) -> list[Record]:
        if not messages:
            return []
        with self._lock, write_txn(self._conn):
            return insert_records(self._conn, [(topic, m) for m in messages])

    def read(
        self, topic: str, partition: int, offset: int, *, max_records: int = 500, timeout_s: float = 0.0
    ) -> list[Record]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._lock:
            check_partition(self._conn, topic, partition)
        while True:
            with self._lock:
                records = select_records(self._conn, topic, partition, offset, max_records)
            remaining = deadline - time.monotonic()
            if records or remaining <= 0:
                return records
            time.sleep(min(self._poll_interval_s, remaining))

    def end_offset(self, topic: str, partition: int) -> int:
        return self._partition_end(topic, partition, "next_offset")

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """`end_offset` of every partition in one query."""
        wanted = list(partitions)
        with self._lock:
            for tp in wanted:
                check_partition(self._conn, *tp)
            rows = partition_rows(self._conn, "partition_ends", "next_offset", wanted)
        missing = [tp for tp in wanted if tp not in rows]
        if missing:  # dropped from the file after this connection counted their partitions
            raise UnknownTopic(f"topics {sorted({t for t, _ in missing})} do not exist")
        return {tp: rows[tp] for tp in wanted}

    def low_offset(self, topic: str, partition: int) -> int:
        """The first offset still stored; reads below it start there."""
        return self._partition_end(topic, partition, "low_offset")

    def _partition_end(self, topic: str, partition: int, column: str) -> int:
        with self._lock:
            check_partition(self._conn, topic, partition)
            row = self._conn.execute(f"SELECT {column} FROM partition_ends WHERE topic = ? AND partition = ?",
                                     (topic, partition)).fetchone()
        if row is None:  # the topic was dropped from the file after this connection counted its partitions
            raise UnknownTopic(f"topic {topic!r} does not exist")
        return row[0]

    def enforce_retention(self, *, now: int | None = None) -> int:
        """Deletes records older than their topic's retention at `now` (epoch ms); returns how many went.

        Only a prefix of each partition goes (up to the first record still young enough),
        so offsets stay a contiguous range from `low_offset` to `end_offset`.
        """
        cutoff_base = now_ms() if now is None else now
        deleted = 0
        with self._lock, write_txn(self._conn):
            topics = self._conn.execute(
                "SELECT name, partitions, retention_ms FROM topics WHERE retention_ms IS NOT NULL").fetchall()
            for name, partitions, retention_ms in topics:
                for partition in range(partitions):
                    deleted += self._trim(name, partition, cutoff_base - retention_ms)
        return deleted

    def _trim(self, topic: str, partition: int, cutoff_ms: int) -> int:
        tp = (topic, partition)
        young = self._conn.execute(
            "SELECT MIN(offset) FROM records WHERE topic = ? AND partition = ? AND timestamp_ms >= ?",
            (*tp, cutoff_ms)).fetchone()[0]
        if young is None:
            young = self._conn.execute("SELECT next_offset FROM partition_ends WHERE topic = ? AND partition = ?",
                                       tp).fetchone()[0]
        gone = self._conn.execute("DELETE FROM records WHERE topic = ? AND partition = ? AND offset < ?",
                                  (*tp, young)).rowcount
        self._conn.execute(
            "UPDATE partition_ends SET low_offset = MAX(low_offset, ?) WHERE topic = ? AND partition = ?", (young, *tp))
        return gone

    def tail(self, topic: str, offsets: dict[int, int]) -> Tail:
        from pipelines.eventlog.embedded_tail import EmbeddedTail  # one statement per change, not per partition

        return EmbeddedTail(self, topic, offsets)

    def evict(self, group: str, member_id: str) -> bool:
        with self._lock, write_txn(self._conn):
            gone = self._conn.execute("DELETE FROM group_members WHERE grp = ? AND member_id = ?",
                                      (group, member_id)).rowcount
            if gone:  # a new generation: the others see it at their next look
                rebalance(self._conn, group, self._group_options.session_timeout_s)
        return bool(gone)

    def consumer(self, group: str, topics: Sequence[str], *, member_id: str | None = None) -> GroupConsumer:
        member = EmbeddedGroupConsumer(
            connect(self._path, busy_timeout_ms=self._busy_timeout_ms, synchronous=self._synchronous),
            group, list(topics), member_id or uuid.uuid4().hex, self._group_options,
            on_close=self._consumers.discard)
        self._consumers.add(member)
        return member

    def close(self) -> None:
        for member in list(self._consumers):
            member.close()
        with self._lock:
            self._conn.close()
