"""Killing the projector mid-batch and restarting it neither counts an event twice nor
skips one: rows and input positions commit in one transaction, on PostgreSQL and SQLite."""
from __future__ import annotations

import os
import signal
import sys
import textwrap

import pytest
from sqlalchemy import select

from models.tables import checkpoints, usage_ledger
from pipelines.audit.digest import table_digests
from pipelines.audit.replay import replay
from pipelines.projections import all_projections
from pipelines.projections.base import Projection
from pipelines.projections.sql import open_projection_db
from tests.helpers import ROOT, Launched
from tests.integration.conftest_ledger import EVERY, SIGNER, project, runner_for
from tests.ledger_workload import Workload, append_all


def positions(engine) -> dict:
    with engine.connect() as conn:
        return {tuple(r[:3]): r[3] for r in conn.execute(select(checkpoints))}


def usage_rows(engine) -> int:
    with engine.connect() as conn:
        return len(conn.execute(select(usage_ledger.c.source_id)).all())


class Tripwire(Projection):
    """Fails the unit of work it is part of on its `fail_on`-th batch, after the other
    projections of that batch have written their rows."""

    name, tables, handles = "tripwire", (), None

    def __init__(self, fail_on: int):
        self.fail_on, self.calls = fail_on, 0

    def apply(self, conn, events) -> None:
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError("injected failure in the middle of a batch")


def build_log(opener, generations: int = 300):
    log = opener()
    workload = Workload(seed=21, tenants=4)
    append_all(log, workload.admin() + workload.generations(generations))
    return log, workload


def test_a_failed_batch_leaves_nothing_and_the_retry_counts_once(ledger_log, ledger_dbs):
    log, _ = build_log(ledger_log)
    url = ledger_dbs.new()
    engine = open_projection_db(url)
    runner = runner_for(log, url, batch_events=300,
                        projections=[*all_projections(SIGNER, checkpoint_every=EVERY), Tripwire(fail_on=3)])
    runner.run_once()
    runner.run_once()
    before, rows_before = positions(engine), table_digests(engine)
    with pytest.raises(RuntimeError, match="injected"):
        runner.run_once()
    assert positions(engine) == before and table_digests(engine) == rows_before  # all or nothing
    runner.run_until_caught_up()  # the same runner retries from the stored positions

    clean = replay(log, ledger_dbs.new(migrate=False), SIGNER, checkpoint_every=EVERY)
    assert table_digests(engine) == clean.digests
    engine.dispose()


STALLING_PROJECTOR = textwrap.dedent("""
    import sys, threading
    from pathlib import Path
    from pipelines.projections import all_projections
    from tests.integration.conftest_ledger import EVERY, SIGNER, open_spec, runner_for

    log_spec, db_url, marker, stall_on = sys.argv[1:5]
    projections = all_projections(SIGNER, checkpoint_every=EVERY)
    generations, original, calls = projections[0], projections[0].apply, [0]

    def apply(conn, events):
        original(conn, events)  # this batch's rows are written; its transaction is still open
        calls[0] += 1
        if calls[0] == int(stall_on):
            Path(marker).write_text("in the middle of a batch")
            threading.Event().wait()  # hold the open transaction until SIGKILL

    generations.apply = apply
    runner_for(open_spec(log_spec), db_url, batch_events=250, projections=projections).run_until_caught_up()
""")


def test_sigkill_mid_batch_then_restart_neither_doubles_nor_skips(ledger_log, ledger_dbs, tmp_path):
    log, workload = build_log(ledger_log)
    url = ledger_dbs.new()
    marker = tmp_path / "stalled"
    with Launched([sys.executable, "-c", STALLING_PROJECTOR, ledger_log.spec, url, str(marker), "4"],
                  env={**os.environ, "PYTHONPATH": str(ROOT)}, log=tmp_path / "projector.log") as child:
        child.wait_until(marker.exists, 120, what="the projector to stall in its 4th batch")
        child.stop(signal.SIGKILL)

    engine = open_projection_db(url)
    done = sum(pos for (name, _, _), pos in positions(engine).items() if name == "generations")
    assert 0 < done < workload.expected.events  # three batches committed, the fourth rolled back

    project(log, url, batch_events=250)  # restart
    clean = replay(log, ledger_dbs.new(migrate=False), SIGNER, checkpoint_every=EVERY)
    assert table_digests(engine) == clean.digests
    settled = sum(v for k, v in workload.expected.statuses.items() if k not in ("rejected", "batch_completed"))
    chunks = sum(workload.expected.settled[t]["batch_chunks"] for t in workload.tenants)
    assert usage_rows(engine) == settled + chunks
    engine.dispose()


def test_a_second_runner_on_the_same_database_is_fenced_not_doubled(embedded_ledger_log, ledger_dbs):
    """Two projectors started by mistake: the one whose positions moved underneath it rolls
    back its batch and rereads, so every event is still applied once."""
    from pipelines.projections.runner import PositionsMoved

    log, _ = build_log(embedded_ledger_log, generations=120)
    url = ledger_dbs.new()
    first, second = runner_for(log, url, batch_events=200), runner_for(log, url, batch_events=200)
    first.positions(), second.positions()  # both start from the same stored positions
    first.run_once()
    with pytest.raises(PositionsMoved):
        second.run_once()

    def step(runner) -> int:
        try:
            return runner.run_once()
        except PositionsMoved:
            return -1  # rolled back; it rereads the positions and tries again

    while (step(first), step(second)) != (0, 0):  # two projectors interleaving until caught up
        pass
    clean = replay(log, ledger_dbs.new(migrate=False), SIGNER, checkpoint_every=EVERY)
    engine = open_projection_db(url)
    assert table_digests(engine) == clean.digests
    engine.dispose()


def test_a_log_without_a_newer_durable_topic_is_projected_and_the_topic_picked_up_later(tmp_path):
    """An older log may lack a topic this build reads (the batches topic came later)."""
    from migrations.runner import upgrade
    from models import topics
    from pipelines.eventlog import TopicSpec, open_event_log

    log = open_event_log(f"sqlite:///{tmp_path / 'old.db'}")
    log.ensure_topics([TopicSpec(t.name, t.partitions) for t in topics.DURABLE if t is not topics.BATCHES])
    workload = Workload(seed=2, tenants=2)
    events = workload.admin() + workload.generations(120)
    append_all(log, [(t, e) for t, e in events if t is not topics.BATCHES])
    url = f"sqlite:///{tmp_path / 'p.db'}"
    upgrade(url)
    runner = runner_for(log, url)
    runner.run_until_caught_up()
    log.ensure_topics([TopicSpec(topics.BATCHES.name, topics.BATCHES.partitions)])
    append_all(log, [(t, e) for t, e in events if t is topics.BATCHES])
    runner.run_until_caught_up()
    engine = open_projection_db(url)
    assert table_digests(engine) == replay(log, f"sqlite:///{tmp_path / 'r.db'}", SIGNER,
                                           checkpoint_every=EVERY).digests
    engine.dispose()
