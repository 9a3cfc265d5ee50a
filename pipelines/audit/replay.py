"""`ledgerlm replay --into DB_URL`: rebuild every projection from the log alone.

The target must be empty (a fresh database, or one with no projected rows): replaying
into live rows would double count. The result is the digest of every projected table;
replaying the same log twice, or comparing with a live database that has read the same
log, gives the same digests.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import func, inspect, select

from migrations.runner import upgrade
from models.tables import PROJECTED_TABLES, checkpoints
from pipelines.audit.digest import TableDigest, table_digests
from pipelines.signing import Signer
from pipelines.eventlog import EventLog
from pipelines.projections import all_projections
from pipelines.projections.runner import ProjectionRunner
from pipelines.projections.sql import open_projection_db


class ReplayTargetNotEmpty(RuntimeError):
    pass


@dataclass
class ReplayResult:
    digests: list[TableDigest]
    records: int
    seconds: float
    cpu_seconds: float = 0.0  # of this process, all threads: what the replay cost apart from the database

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


def ensure_empty(engine) -> None:
    with engine.connect() as conn:
        present = set(inspect(conn).get_table_names())
        for table in (checkpoints, *PROJECTED_TABLES):
            if table.name in present and conn.execute(select(func.count()).select_from(table)).scalar():
                raise ReplayTargetNotEmpty(f"{table.name} already has rows: replay into an empty database")


def replay(log: EventLog, into_url: str, signer: Signer, *, batch_events: int = 5000,
           checkpoint_every: int | None = None) -> ReplayResult:
    engine = open_projection_db(into_url)
    try:
        ensure_empty(engine)
        upgrade(into_url)
        runner = ProjectionRunner(log, engine, all_projections(signer, checkpoint_every=checkpoint_every),
                                  batch_events=batch_events)
        started, cpu = time.perf_counter(), time.process_time()
        records = runner.run_until_caught_up()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        return ReplayResult(table_digests(engine), records, seconds, cpu)
    finally:
        engine.dispose()
