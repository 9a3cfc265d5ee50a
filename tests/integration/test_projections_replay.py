"""Replay determinism: the live projections, built batch by batch while the log grows,
equal a rebuild from the log alone into an empty database, every time, table by table.
On PostgreSQL and SQLite, with the log on Kafka and embedded."""
from __future__ import annotations

from collections import defaultdict

import pytest

from pipelines.audit.digest import table_digests
from pipelines.audit.replay import ReplayTargetNotEmpty, replay
from pipelines.audit.verify import verify
from pipelines.projections.queries import usage_summary
from pipelines.projections.sql import open_projection_db
from tests.integration.conftest_ledger import EVERY, SIGNER, project, runner_for
from tests.ledger_workload import Workload, append_all


def digests(items) -> dict[str, tuple[int, str]]:
    return {d.table: (d.rows, d.sha256) for d in items}


def totals_by_tenant(engine, tenants) -> dict[str, dict[str, int]]:
    out = {}
    for tenant in tenants:
        days = usage_summary(engine, tenant, group_by="day")
        out[tenant] = {k: sum(d[k] for d in days) for k in ("input_tokens", "output_tokens", "cost_micros")}
        out[tenant]["requests"] = sum(d["generations"] for d in days)
        out[tenant]["batch_chunks"] = sum(d["batch_chunks"] for d in days)
    return out


def test_replay_rebuilds_the_live_projections_exactly(ledger_log, ledger_dbs):
    log = ledger_log()
    workload = Workload(seed=5)
    append_all(log, workload.admin())
    live_url = ledger_dbs.new()
    runner = runner_for(log, live_url, batch_events=400)
    for burst in range(3):  # live: the projector catches up between bursts of traffic
        append_all(log, workload.generations(110, start=burst * 110, total=330))
        runner.run_until_caught_up()
    assert all(lag.records == 0 for lag in runner.lag())
    live_engine = open_projection_db(live_url)
    live = digests(table_digests(live_engine))

    first = replay(log, ledger_dbs.new(migrate=False), SIGNER, batch_events=777, checkpoint_every=EVERY)
    second = replay(log, ledger_dbs.new(migrate=False), SIGNER, batch_events=5000, checkpoint_every=EVERY)
    assert digests(first.digests) == digests(second.digests) == live
    assert live["generations"][0] == 330 and live["audit_trail"][0] == workload.expected.events

    # The rows say what happened: settled usage per tenant is what the workload settled.
    expected = {t: {k: workload.expected.settled[t][k] for k in
                    ("input_tokens", "output_tokens", "cost_micros", "requests", "batch_chunks")}
                for t in workload.tenants}
    assert totals_by_tenant(live_engine, workload.tenants) == expected

    report = verify(log, live_engine, SIGNER, checkpoint_every=EVERY)
    assert report.ok, report.first
    assert report.records == workload.expected.events and report.checkpoints > 0
    live_engine.dispose()


def test_replay_refuses_a_database_with_rows(embedded_ledger_log, tmp_path):
    log = embedded_ledger_log()
    append_all(log, Workload(seed=1, tenants=2).admin())
    url = f"sqlite:///{tmp_path / 'live.db'}"
    from migrations.runner import upgrade

    upgrade(url)
    project(log, url)
    with pytest.raises(ReplayTargetNotEmpty):
        replay(log, url, SIGNER)


def test_postgres_and_sqlite_projections_have_the_same_digests(embedded_ledger_log, tmp_path, postgres_url):
    """Digests normalize values across databases, so an auditor may rebuild into either."""
    from tests.integration.conftest_ledger import Databases

    log = embedded_ledger_log()
    workload = Workload(seed=9, tenants=3)
    append_all(log, workload.admin() + workload.generations(150))
    sqlite, postgres = Databases("sqlite", tmp_path), Databases("postgres", tmp_path)
    try:
        on_sqlite = replay(log, sqlite.new(migrate=False), SIGNER, checkpoint_every=EVERY)
        on_postgres = replay(log, postgres.new(migrate=False), SIGNER, checkpoint_every=EVERY)
    finally:
        postgres.drop_all()
    assert digests(on_sqlite.digests) == digests(on_postgres.digests)
    statuses = defaultdict(int, workload.expected.statuses)
    assert on_sqlite.records == workload.expected.events and statuses["completed"] > 0


def test_transactional_writes_are_projected_and_their_markers_stepped_over(ledger_log, tmp_path):
    """The admission processor writes the ledger with `commit_with` (a Kafka transaction,
    which leaves a marker after its records): the projector still catches up, lag 0."""
    from models import topics
    from pipelines.publish import to_outputs

    log = ledger_log()
    workload = Workload(seed=31, tenants=2)
    events = workload.admin() + workload.generations(40)
    append_all(log, [(t, e) for t, e in events if t is not topics.LEDGER])
    ledger = [(t, e) for t, e in events if t is topics.LEDGER]
    consumer = log.consumer("ledger-writer-" + tmp_path.name, [topics.ADMIN.name])
    try:
        for _ in range(60):  # joins the group (bounded: each poll waits up to a second)
            consumer.poll(timeout_s=1.0)
            if consumer.assignment():
                break
        assert consumer.assignment(), "the writer never joined its group"
        for start in range(0, len(ledger), 25):  # many small transactions, as admission commits
            consumer.commit_with(to_outputs(ledger[start:start + 25]))
    finally:
        consumer.close()
    url = f"sqlite:///{tmp_path / 'live.db'}"
    from migrations.runner import upgrade

    upgrade(url)
    runner = project(log, url)
    assert sum(lag.records for lag in runner.lag()) == 0
    engine = open_projection_db(url)
    assert verify(log, engine, SIGNER, checkpoint_every=EVERY).ok
    again = replay(log, f"sqlite:///{tmp_path / 'again.db'}", SIGNER, checkpoint_every=EVERY)
    assert digests(table_digests(engine)) == digests(again.digests)
    assert totals_by_tenant(engine, workload.tenants)[workload.tenants[0]]["requests"] == \
        workload.expected.settled[workload.tenants[0]]["requests"]
    engine.dispose()


def test_a_projection_added_later_catches_up_while_the_others_skip_what_they_have(embedded_ledger_log, tmp_path):
    from migrations.runner import upgrade
    from pipelines.projections.generations import GenerationsProjection

    log = embedded_ledger_log()
    workload = Workload(seed=17, tenants=3)
    append_all(log, workload.admin() + workload.generations(150))
    url = f"sqlite:///{tmp_path / 'live.db'}"
    upgrade(url)
    runner_for(log, url, projections=[GenerationsProjection()]).run_until_caught_up()
    append_all(log, workload.generations(50, start=150, total=200))  # the first one is behind again
    runner_for(log, url, batch_events=300).run_until_caught_up()  # every projection; audit etc. start at 0
    engine = open_projection_db(url)
    again = replay(log, f"sqlite:///{tmp_path / 'again.db'}", SIGNER, checkpoint_every=EVERY)
    assert digests(table_digests(engine)) == digests(again.digests)
    engine.dispose()
