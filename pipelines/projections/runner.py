"""The projection runner: reads the durable topics and keeps every projection up to date.

One unit of work (`run_once`) reads up to `batch_events` records, parses each once, and
in ONE database transaction lets each projection write its rows and stores its new
input positions in `projection_checkpoints`. A crash anywhere rolls both back, so the
next run reads the same records again and nothing is counted twice or skipped.

Positions are read through `EventLog.read` per partition, outside any consumer group:
the positions that matter are the ones in the database, next to the rows.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Sequence

from sqlalchemy import Connection, Engine, select

from models import tables, topics
from pipelines.eventlog import EventLog, Record, UnknownTopic
from pipelines.outage import Readiness, is_transient, keep_running
from pipelines.projections.base import Event, Projection, parse_record, schema_versions
from pipelines.projections.sql import upsert

logger = logging.getLogger(__name__)

TP = tuple[str, int]
MIN_SHARE = 16  # records read from a partition per batch, however little it lags


class PositionsMoved(RuntimeError):
    """Another runner advanced these projections meanwhile; this batch was rolled back."""


@dataclass
class _Batch:
    events: list[Event]
    old: dict[str, dict[TP, int]]  # positions it starts from
    new: dict[str, dict[TP, int]]  # positions once applied


@dataclass(frozen=True)
class Lag:
    projection: str
    topic: str
    partition: int
    position: int
    end: int

    @property
    def records(self) -> int:
        return max(0, self.end - self.position)


class ProjectionRunner:
    def __init__(
        self,
        log: EventLog,
        engine: Engine,
        projections: Sequence[Projection],
        *,
        topic_names: Iterable[str] = tuple(t.name for t in topics.DURABLE),
        batch_events: int = 5000,
    ):
        names = [p.name for p in projections]
        if len(set(names)) != len(names):
            raise ValueError(f"projection names must be unique: {names}")
        self._log, self._engine, self.projections = log, engine, list(projections)
        self._topics = list(topic_names)
        self.batch_events = batch_events
        self._versions = schema_versions()
        self._tps: list[TP] | None = None
        self._positions: dict[str, dict[TP, int]] | None = None
        self._loaded_tps: list[TP] = []
        self.events_applied = 0
        self._last_ends: dict[TP, int] = {}  # the log's ends at its last look (`last_lag`)
        self.unreadable = 0  # records no projection but the audit trail could read (logged)

    # -- positions -------------------------------------------------------------------

    def partitions(self) -> list[TP]:
        if self._tps is None:
            tps, missing = [], []
            for topic in self._topics:
                try:
                    tps += [(topic, p) for p in range(self._log.partitions(topic))]
                except UnknownTopic:
                    missing.append(topic)  # a log older than this build's topics: read the rest
            if missing:
                logger.warning("durable topics missing from the log, not projected yet: %s", missing)
                return tps  # not cached: looked up again, so a topic created later is picked up
            self._tps = tps
        return self._tps

    def _read_positions(self, conn: Connection) -> dict[str, dict[TP, int]]:
        c = tables.checkpoints.c
        query = select(c.projection, c.topic, c.partition, c.next_offset).where(
            c.projection.in_([p.name for p in self.projections]))
        if conn.dialect.name == "postgresql":
            query = query.with_for_update()  # fences a second runner until this batch commits
        stored: dict[str, dict[TP, int]] = {p.name: {} for p in self.projections}
        for name, topic, partition, offset in conn.execute(query):
            stored[name][(topic, partition)] = offset
        return {name: {tp: stored[name].get(tp, 0) for tp in self.partitions()} for name in stored}

    def load(self) -> None:
        """Reads positions and projection state from the database (at start, after a failure)."""
        with self._engine.connect() as conn:
            self._loaded_tps = self.partitions()
            self._positions = self._read_positions(conn)
            for projection in self.projections:
                projection.load(conn)
            conn.rollback()

    def positions(self) -> dict[str, dict[TP, int]]:
        if self._positions is None or self.partitions() != self._loaded_tps:  # (a topic may have appeared)
            self.load()
        return {name: dict(p) for name, p in self._positions.items()}

    def end_offsets(self) -> dict[TP, int]:
        self._last_ends = {(t, p): self._log.end_offset(t, p) for t, p in self.partitions()}
        return self._last_ends

    def last_lag(self) -> dict[str, int]:
        """Records behind per projection, as of the last look at the log's ends: no I/O, so
        another thread (a metrics scrape) may ask while this one runs."""
        ends, positions = self._last_ends, self._positions or {}
        return {name: sum(max(0, end - p.get(tp, 0)) for tp, end in ends.items()) for name, p in positions.items()}

    def lag(self) -> list[Lag]:
        ends = self.end_offsets()
        return [Lag(name, tp[0], tp[1], pos, ends[tp])
                for name, positions in self.positions().items() for tp, pos in positions.items()]

    # -- one unit of work --------------------------------------------------------------

    def _read(self, start: dict[TP, int], ends: dict[TP, int]) -> tuple[list[Record], dict[TP, int]]:
        """Records from `start` on, about `batch_events` of them, and where each partition got to.

        Each partition gets a share of the batch in proportion to how far behind it is, so
        all partitions advance at the same pace: events of one request, spread over the
        requests, ledger and outcomes topics, then land in the same or adjacent batches.
        """
        behind = {tp: ends[tp] - start[tp] for tp in self.partitions() if ends[tp] > start[tp]}
        if not behind:
            return [], {}
        total = sum(behind.values())
        records: list[Record] = []
        reached: dict[TP, int] = {}
        for tp, lag in behind.items():
            share = max(MIN_SHARE, -(-self.batch_events * lag // total))
            batch = self._log.read(tp[0], tp[1], start[tp], max_records=share)
            # Nothing readable below an end taken before the read: on Kafka that range holds
            # only transaction markers or aborted records, so the position may skip it. (Were
            # a read ever to time out instead, `audit verify` names the record skipped.)
            reached[tp] = batch[-1].offset + 1 if batch else ends[tp]
            if not batch:
                logger.debug("stepping over %s/%s offsets %d..%d: nothing committed there", *tp, start[tp], ends[tp])
            records += batch
        return records, reached

    def _prepare(self, positions: dict[str, dict[TP, int]]) -> _Batch | None:
        """Reads and parses the batch that follows `positions`; None when there is none."""
        ends = self.end_offsets()
        start = {tp: min(p[tp] for p in positions.values()) for tp in self.partitions()}
        records, reached = self._read(start, ends)
        if not reached:
            return None
        new = {name: {tp: max(p[tp], reached.get(tp, p[tp])) for tp in p} for name, p in positions.items()}
        return _Batch([parse_record(r, self._versions) for r in records], positions, new)

    def _apply(self, batch: _Batch) -> int:
        try:
            self._commit(batch.events, batch.old, batch.new)
        except BaseException:
            self._positions = None  # reread positions and projection state before the next try
            raise
        self._positions = batch.new
        self.events_applied += len(batch.events)
        self.unreadable += sum(1 for e in batch.events if e.type is None)
        return len(batch.events)

    def run_once(self) -> int:
        """Applies one batch; returns how many records it read (0 when caught up)."""
        batch = self._prepare(self.positions())
        return 0 if batch is None else self._apply(batch)

    def _commit(self, events: list[Event], old: dict[str, dict[TP, int]], new: dict[str, dict[TP, int]]) -> None:
        with self._engine.connect() as conn:
            conn = conn.execution_options(sqlite_write=True)
            with conn.begin():
                if self._read_positions(conn) != old:
                    raise PositionsMoved("projection positions changed under this runner; reloading")
                floor = {tp: min(p[tp] for p in old.values()) for tp in next(iter(old.values()))}
                for projection in self.projections:
                    mine = old[projection.name]
                    batch = self._events_for(projection, events, mine, ahead=any(mine[tp] > floor[tp] for tp in mine))
                    if batch:
                        projection.apply(conn, batch)
                    moved = [{"projection": projection.name, "topic": tp[0], "partition": tp[1], "next_offset": pos}
                             for tp, pos in new[projection.name].items() if pos != mine[tp]]
                    upsert(conn, tables.checkpoints, moved)

    @staticmethod
    def _events_for(projection: Projection, events: list[Event], mine: dict[TP, int], *, ahead: bool) -> list[Event]:
        """The batch's events this projection reads: of its types and topics, and (only when
        it is ahead of another projection, say a newly added one) not already applied."""
        types, names = projection.handles, projection.topics
        if types is None and names is None and not ahead:
            return events
        return [e for e in events if (types is None or e.type in types) and (names is None or e.topic in names)
                and (not ahead or e.offset >= mine[(e.topic, e.partition)])]

    # -- loops ---------------------------------------------------------------------------

    def run_until_caught_up(self, ends: dict[TP, int] | None = None, stop: threading.Event | None = None) -> int:
        """Runs batches until every projection has read up to `ends` (default: the ends now),
        or `stop` is set; returns how many records were applied.

        The next batch is read and parsed in a thread while this one commits: the commit
        mostly waits on the database, so reading the log and writing rows overlap.
        """
        ends = self.end_offsets() if ends is None else ends
        applied = 0
        with ThreadPoolExecutor(1, thread_name_prefix="projection-read") as reader:
            batch = None if self._reached(self.positions(), ends) else self._prepare(self.positions())
            while batch is not None and not (stop is not None and stop.is_set()):
                following = None if self._reached(batch.new, ends) else reader.submit(self._prepare, batch.new)
                applied += self._apply(batch)  # on failure the `with` waits for the reader, then raises
                batch = following.result() if following is not None else None
        return applied

    @staticmethod
    def _reached(positions: dict[str, dict[TP, int]], ends: dict[TP, int]) -> bool:
        return all(pos >= ends.get(tp, 0) for p in positions.values() for tp, pos in p.items())

    def run(self, stop: threading.Event, *, idle_s: float = 0.5, lag_every_s: float = 30.0,
            readiness: Readiness | None = None) -> None:
        """Keeps projections up to date until `stop` is set; a failed batch is retried. A
        log or database that fails is waited out with backoff (`readiness` down meanwhile),
        from the positions stored in the database."""
        last_report = [time.monotonic()]

        def step() -> None:
            try:
                applied = self.run_until_caught_up(stop=stop)
            except PositionsMoved as exc:
                logger.warning("%s", exc)
                applied = 0
            except Exception as exc:
                if is_transient(exc):
                    raise  # waited out by `keep_running`
                logger.exception("projection batch failed; retrying from the stored positions")
                stop.wait(1.0)
                return
            if time.monotonic() - last_report[0] > lag_every_s:
                last_report[0] = time.monotonic()
                behind = sum(lag.records for lag in self.lag())
                logger.info("projections: %d events applied, %d records behind", self.events_applied, behind)
            if applied == 0:
                stop.wait(idle_s)  # caught up: poll the log again shortly

        keep_running(step, stop, readiness=readiness or Readiness("projector"), recover=self._forget_positions)

    def _forget_positions(self) -> None:
        """Positions and projection state are read from the database again before the next batch."""
        self._positions = None
