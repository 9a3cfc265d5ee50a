"""The ledger verbs of the `ledgerlm` command, run as a user runs them: `serve projector`,
`projections status|digest`, `replay --into`, `usage report` (CSV, Parquet, plot)."""
from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from sqlalchemy import func, select

from models.tables import audit_trail
from pipelines.projections.sql import open_projection_db
from tests.helpers import ROOT, Launched
from tests.ledger_workload import Workload, append_all


@pytest.fixture
def setup(ledger_dbs, tmp_path):
    from pipelines.bootstrap import topic_specs
    from pipelines.eventlog import open_event_log

    log_url = f"sqlite:///{tmp_path / 'eventlog.db'}"
    log = open_event_log(log_url)
    log.ensure_topics(topic_specs())
    workload = Workload(seed=12, tenants=3)
    append_all(log, workload.admin() + workload.generations(200))
    log.close()
    db_url = ledger_dbs.new(migrate=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LEDGERLM_HOME": str(tmp_path), "LEDGERLM_EVENT_LOG_URL": log_url,
           "LEDGERLM_DATABASE_URL": db_url, "LEDGERLM_AUDIT_SIGNING_KEY": "cli-test-key"}
    return env, workload, db_url, ledger_dbs


def ledgerlm(env, *args, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def chained(db_url: str) -> int:
    engine = open_projection_db(db_url)
    try:
        with engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(audit_trail)).scalar()
    except Exception:  # the projector may not have created the tables yet
        return 0
    finally:
        engine.dispose()


def test_serve_projector_catches_up_and_stops_on_sigterm_then_replay_matches(setup):
    env, workload, db_url, dbs = setup
    with Launched([sys.executable, "-m", "api.cli", "serve", "projector"], env=env,
                  log=Path(env["LEDGERLM_HOME"]) / "projector.log") as projector:
        projector.wait_until(lambda: chained(db_url) >= workload.expected.events, 120,
                             what="the projector to catch up")
        assert projector.stop(timeout_s=60) == 0, projector.shown()

    status = ledgerlm(env, "projections", "status").stdout
    assert '"audit": 0' in status and '"generations": 0' in status
    live = ledgerlm(env, "projections", "digest").stdout
    replayed = ledgerlm(env, "replay", "--into", dbs.new(migrate=False))
    assert replayed.stdout == live and "records/s" in replayed.stderr
    assert ledgerlm(env, "audit", "verify").stdout.startswith("OK:")
    refused = ledgerlm(env, "replay", "--into", db_url, check=False)
    assert refused.returncode == 2 and "empty database" in refused.stderr


def test_usage_report_as_csv_parquet_and_a_plot(setup, tmp_path):
    env, workload, _, _ = setup
    ledgerlm(env, "projections", "run")
    out = ledgerlm(env, "usage", "report", "--month", "2025-03", "--format", "csv", "--out", "-").stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {r["tenant_id"] for r in rows} == set(workload.tenants)
    for tenant in workload.tenants:
        spent = sum(int(r["cost_micros"]) for r in rows if r["tenant_id"] == tenant)
        assert spent == workload.expected.settled[tenant]["cost_micros"]

    parquet, png = tmp_path / "usage.parquet", tmp_path / "spend.png"
    ledgerlm(env, "usage", "report", "--month", "2025-03", "--format", "parquet", "--out", str(parquet),
             "--plot", str(png))
    table = pq.read_table(parquet)
    assert table.num_rows == len(rows) and sum(table.column("cost_micros").to_pylist()) == sum(
        int(r["cost_micros"]) for r in rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    empty = ledgerlm(env, "usage", "report", "--month", "2024-01", "--format", "csv", "--out", "-").stdout
    assert empty.strip().count("\n") == 0  # a header, no rows
    bad = ledgerlm(env, "usage", "report", "--month", "March", check=False)
    assert bad.returncode == 2 and "YYYY-MM" in bad.stderr
