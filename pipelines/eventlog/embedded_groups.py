"""Consumer groups of the embedded log: membership, assignment, fenced atomic commits.

Members heartbeat into `group_members` whenever they poll or commit; one silent for
longer than the session timeout is dropped by the next member that looks. The roster
(members, their topics, partition counts) has a generation that changes whenever the
roster does; partitions are assigned from the roster alone (Kafka's round-robin), so
every member computes the same split without talking to the others. A commit carries
the generation its records were read under and is refused (`Fenced`) if it moved on.
A member restarted under the same `member_id` is a new instance: it takes the row over,
and the old instance, should it still be running, is fenced for good.
"""
from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from pipelines.eventlog.base import Fenced, GroupConsumer, Message, Record, TopicPartition
from pipelines.eventlog.embedded_store import (
    DataVersion, committed_offset, insert_records, now_ms, partition_rows, select_records, write_txn,
)


@dataclass(frozen=True, slots=True)
class GroupOptions:
    session_timeout_s: float = 10.0
    heartbeat_interval_s: float = 1.0
    # Idle members look every 2 ms, but only ask SQLite whether anything changed
    # (`PRAGMA data_version`) and read only when something did.
    poll_interval_s: float = 0.002


def round_robin(roster: list[tuple[str, list[str]]], counts: dict[str, int]) -> dict[str, set[TopicPartition]]:
    """Partitions in (topic, partition) order dealt to sorted members, skipping the unsubscribed."""
    members = sorted(m for m, _ in roster)
    subscribed = {m: set(topics) for m, topics in roster}
    assigned: dict[str, set[TopicPartition]] = {m: set() for m in members}
    turn = 0
    for topic in sorted(counts):
        for partition in range(counts[topic]):
            for _ in members:
                member = members[turn % len(members)]
                turn += 1
                if topic in subscribed[member]:
                    assigned[member].add((topic, partition))
                    break
    return assigned


def rebalance(conn: sqlite3.Connection, group: str,
              session_timeout_s: float) -> tuple[int, dict[str, set[TopicPartition]]]:
    """Drops silent members and bumps the generation if the roster changed. Inside a write txn."""
    conn.execute("DELETE FROM group_members WHERE grp = ? AND heartbeat_ms < ?",
                 (group, now_ms() - int(session_timeout_s * 1000)))
    roster = [(m, i, json.loads(t)) for m, i, t in conn.execute(
        "SELECT member_id, instance, topics FROM group_members WHERE grp = ? ORDER BY member_id", (group,))]
    names = sorted({t for _, _, topics in roster for t in topics})
    counts = {name: row[0] for name in names
              if (row := conn.execute("SELECT partitions FROM topics WHERE name = ?", (name,)).fetchone())}
    key = json.dumps([roster, counts], sort_keys=True)
    row = conn.execute("SELECT generation, roster FROM group_state WHERE grp = ?", (group,)).fetchone()
    generation = row[0] if row else 0
    if row is None or row[1] != key:
        generation += 1
        conn.execute("INSERT INTO group_state (grp, generation, roster) VALUES (?, ?, ?)"
                     " ON CONFLICT (grp) DO UPDATE SET generation = excluded.generation, roster = excluded.roster",
                     (group, generation, key))
    return generation, round_robin([(m, topics) for m, _, topics in roster], counts)


class EmbeddedGroupConsumer(GroupConsumer):
    """A group member with its own SQLite connection; use it from one thread."""

    def __init__(self, conn: sqlite3.Connection, group: str, topics: list[str], member_id: str,
                 options: GroupOptions, *, on_close: Callable[["EmbeddedGroupConsumer"], None]):
        self._conn = conn
        self._group = group
        self._topics = sorted(set(topics))
        self.member_id = member_id
        self._instance = uuid.uuid4().hex
        self._options = options
        self._on_close = on_close
        self._generation = 0
        self._assigned: set[TopicPartition] = set()
        self._positions: dict[TopicPartition, int] = {}
        self._uncommitted: dict[TopicPartition, int] = {}
        self._stale = False  # records were handed out under an assignment that has since changed
        self._zombie = False  # a newer instance with our member_id took over
        self._joined = False
        self._next_heartbeat = 0.0
        self._turn = 0
        self._closed = False
        self._changes = DataVersion(conn)
        self._dirty = True  # read without waiting for another connection's write
        self._heartbeat(force=True)

    def _heartbeat(self, *, force: bool = False) -> None:
        """Joins or heartbeats when due, or at once when another member changed the roster."""
        if self._zombie:
            return
        if not force and time.monotonic() < self._next_heartbeat:
            row = self._conn.execute("SELECT generation FROM group_state WHERE grp = ?", (self._group,)).fetchone()
            if row is not None and row[0] == self._generation:
                return
        with write_txn(self._conn):
            row = self._conn.execute("SELECT instance FROM group_members WHERE grp = ? AND member_id = ?",
                                     (self._group, self.member_id)).fetchone()
            if self._joined and row is not None and row[0] != self._instance:
                self._zombie = True
                self._adopt(self._generation, set())
                return
            # A member dropped for silence simply joins again; its stale records stay fenced.
            self._conn.execute(
                "INSERT INTO group_members (grp, member_id, instance, topics, heartbeat_ms) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (grp, member_id) DO UPDATE SET instance = excluded.instance,"
                " topics = excluded.topics, heartbeat_ms = excluded.heartbeat_ms",
                (self._group, self.member_id, self._instance, json.dumps(self._topics), now_ms()))
            self._joined = True
            generation, assignment = rebalance(self._conn, self._group, self._options.session_timeout_s)
            if generation != self._generation:
                self._adopt(generation, assignment.get(self.member_id, set()))
        self._next_heartbeat = time.monotonic() + self._options.heartbeat_interval_s

    def _adopt(self, generation: int, assigned: set[TopicPartition]) -> None:
        # Every partition restarts from its committed offset: between two generations we saw,
        # another member may have owned it and moved on.
        self._stale = self._stale or bool(self._uncommitted)
        self._uncommitted = {}
        self._generation = generation
        self._assigned = assigned
        self._positions = {tp: committed_offset(self._conn, self._group, *tp) or 0 for tp in assigned}
        self._dirty = True

    def poll(self, *, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            # Another connection's commit (new records, a roster change) moves the data
            # version. Looked at before fetching, so a write racing the fetch is seen next turn.
            if self._changes.moved() or self._dirty or time.monotonic() >= self._next_heartbeat:
                self._dirty = False
                self._heartbeat()
                records = self._fetch(max_records)
                if records:
                    self._dirty = len(records) >= max_records  # more may be waiting
                    return records
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            time.sleep(min(self._options.poll_interval_s, remaining))

    def _fetch(self, max_records: int) -> list[Record]:
        order = sorted(self._assigned)
        if not order:
            return []
        self._turn = (self._turn + 1) % len(order)  # rotate so one busy partition cannot starve the rest
        records: list[Record] = []
        for tp in order[self._turn:] + order[:self._turn]:
            if len(records) >= max_records:
                break
            batch = select_records(self._conn, *tp, self._positions[tp], max_records - len(records))
            if batch:
                self._positions[tp] = self._uncommitted[tp] = batch[-1].offset + 1
                records += batch
        return records

    def commit(self) -> None:
        self.commit_with([])

    def commit_with(self, outputs: Sequence[tuple[str, Message]], *,
                    offsets: Mapping[TopicPartition, int] | None = None,
                    on_committed: Callable[[], None] | None = None) -> None:
        chosen = self._uncommitted if offsets is None else dict(offsets)
        if not outputs and not chosen and not self._stale and not self._zombie:
            return
        try:
            if self._zombie:
                raise Fenced(f"{self.member_id}: a newer instance of this member took over {self._group!r}")
            if self._stale:
                raise Fenced(f"{self.member_id}: records were polled before a rebalance of {self._group!r}")
            with write_txn(self._conn):
                alive = self._conn.execute(
                    "UPDATE group_members SET heartbeat_ms = ? WHERE grp = ? AND member_id = ? AND instance = ?",
                    (now_ms(), self._group, self.member_id, self._instance)).rowcount
                generation, _ = rebalance(self._conn, self._group, self._options.session_timeout_s)
                if not alive or generation != self._generation:
                    raise Fenced(f"{self.member_id}: group {self._group!r} rebalanced (generation "
                                 f"{self._generation} -> {generation}); nothing was written")
                insert_records(self._conn, outputs)
                self._conn.executemany(
                    "INSERT INTO group_offsets (grp, topic, partition, next_offset) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (grp, topic, partition) DO UPDATE SET next_offset = excluded.next_offset",
                    [(self._group, t, p, offset) for (t, p), offset in chosen.items()])
        except Fenced:
            # Positions handed out under the old assignment are void; the next poll rejoins.
            self.seek_to_committed()
            self._next_heartbeat = 0.0
            raise
        self._uncommitted = {tp: pos for tp, pos in self._uncommitted.items() if pos > chosen.get(tp, -1)}
        self._dirty = self._dirty or bool(outputs)  # our own writes do not move data_version
        if on_committed is not None:
            on_committed()

    def committed(self, topic: str, partition: int) -> int | None:
        return committed_offset(self._conn, self._group, topic, partition)

    def committed_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        wanted = list(partitions)
        found = partition_rows(self._conn, "group_offsets", "next_offset", wanted, where=" AND grp = ?",
                               args=(self._group,))
        return {tp: found.get(tp) for tp in wanted}

    def seek_to_committed(self) -> None:
        self._stale = False
        self._uncommitted = {}
        self._positions = {tp: committed_offset(self._conn, self._group, *tp) or 0 for tp in self._assigned}
        self._dirty = True

    def assignment(self) -> set[TopicPartition]:
        self._heartbeat()
        return set(self._assigned)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            # Leaving (rather than going silent) lets the others take over at once.
            with write_txn(self._conn):
                self._conn.execute("DELETE FROM group_members WHERE grp = ? AND member_id = ? AND instance = ?",
                                   (self._group, self.member_id, self._instance))
                rebalance(self._conn, self._group, self._options.session_timeout_s)
        finally:
            self._conn.close()
            self._on_close(self)
