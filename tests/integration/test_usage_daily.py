"""The daily usage rollup equals the usage ledger, to the micro-unit, however the events
arrive: in many small batches, and with a settlement read before the request naming its
application and key (the row then moves, and nothing is left behind at the empty key)."""
from __future__ import annotations

import sqlalchemy as sa

from models.tables import usage_daily
from pipelines.projections.generations import GenerationsProjection
from pipelines.projections.sql import open_projection_db
from tests.integration.conftest_ledger import project
from tests.ledger_workload import Workload, append_all
from tests.unit.test_projection_merge import completed_generation

LEDGER_SUMS = sa.text(
    "SELECT tenant_id, day, COALESCE(application_id, ''), COALESCE(key_id, ''), COALESCE(model_revision, ''), "
    "SUM(CASE WHEN source = 'generation' THEN 1 ELSE 0 END), SUM(CASE WHEN source = 'batch_chunk' THEN 1 ELSE 0 END), "
    "SUM(CASE WHEN cached THEN 1 ELSE 0 END), SUM(input_tokens), SUM(output_tokens), "
    "SUM(COALESCE(delivered_output_tokens, output_tokens)), SUM(cost_micros) FROM usage_ledger "
    "GROUP BY 1, 2, 3, 4, 5")


def rollup_rows(engine) -> set[tuple]:
    with engine.connect() as conn:
        return {tuple(int(v) if isinstance(v, int) else v for v in row) for row in conn.execute(sa.select(usage_daily))}


def ledger_sums(engine) -> set[tuple]:
    with engine.connect() as conn:
        return {tuple(int(v) if not isinstance(v, str) else v for v in row) for row in conn.execute(LEDGER_SUMS)}


def test_the_rollup_is_the_ledger_summed_per_day_application_key_and_revision(embedded_ledger_log, ledger_dbs):
    log = embedded_ledger_log()
    workload = Workload(seed=11)
    append_all(log, workload.admin())
    append_all(log, workload.generations(160, total=160))
    url = ledger_dbs.new()
    project(log, url, batch_events=7)  # small batches: topics read at different paces
    engine = open_projection_db(url)
    try:
        rollup, sums = rollup_rows(engine), ledger_sums(engine)
        assert rollup == sums and len(rollup) > 3
        assert sum(r[6] for r in rollup) > 0, "the workload's batch chunks are in the rollup"
    finally:
        engine.dispose()
        log.close()


def test_a_settlement_read_before_its_request_moves_to_the_requests_key(ledger_dbs):
    events = completed_generation()
    requested, rest = events[0], events[1:]
    url = ledger_dbs.new()
    engine = open_projection_db(url)
    projection = GenerationsProjection()
    try:
        for batch in (rest, [requested]):
            with engine.begin() as conn:
                projection.apply(conn, batch)
        rows = rollup_rows(engine)
        assert rows == ledger_sums(engine)
        assert [(r[2], r[3], r[4], r[5], r[8], r[9], r[11]) for r in rows] == [("chat", "key_1", "tiny@r1", 1, 40, 12, 9)]
    finally:
        engine.dispose()
