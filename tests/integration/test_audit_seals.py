"""Chain heads sealed on time: a trail whose tail was unsigned (which a consistent rewrite
of log and trail could replace unseen) ends signed once sealed, and a rewrite after the
seal is caught. The projector refuses the public development key on shared services."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from models import topics
from models.settings import Settings
from pipelines.audit.seal import seal_heads
from pipelines.signing import dev_key_refused
from pipelines.audit.verify import verify
from tests.integration.conftest_ledger import EVERY, SIGNER
from pipelines.projections.sql import open_projection_db
from tests.helpers import Launched
from tests.integration.test_audit_tamper import ROOT, TOPIC, audited, edit_log, value_at  # noqa: F401 - a fixture
from tests.integration.test_projections_cli import chained, ledgerlm, setup  # noqa: F401 - `setup` is a fixture

WHERE = 'topic = :t AND "partition" = :p'


@pytest.fixture
def trail(ledger_dbs, request):
    """`test_audit_tamper`'s `audited`: (log, engine, log path, busiest ledger partition)."""
    return request.getfixturevalue("audited")


def rewrite_last_record(engine, path, partition: int) -> int:
    """Replaces the partition's last record on the log and its trail row consistently, as
    someone with write access to both (but not the signing key) would; returns its offset."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f'SELECT "offset", link FROM audit_trail WHERE {WHERE} ORDER BY "offset" DESC '
                                    'LIMIT 2'), {"t": TOPIC, "p": partition}).all()
    (offset, _), (_, previous) = rows
    forged = value_at(path, partition, offset) + b" "  # any change: the chain is recomputed to match
    hashed = hashlib.sha256(forged).digest()
    link = hashlib.sha256(bytes(previous) + hashed).digest()
    edit_log(path, ("UPDATE records SET value = ? WHERE topic = ? AND partition = ? AND offset = ?",
                    (forged, TOPIC, partition, offset)))
    with engine.begin() as conn:
        conn.execute(sa.text(f'UPDATE audit_trail SET event_hash = :h, link = :l WHERE {WHERE} AND "offset" = :o'),
                     {"h": hashed, "l": link, "t": TOPIC, "p": partition, "o": offset})
    return offset


def test_sealing_signs_every_chain_head_so_no_tail_is_left_unsigned(trail):
    log, engine, _, _ = trail
    before = verify(log, engine, SIGNER, checkpoint_every=EVERY)
    assert before.ok and before.unsigned_tail > 0
    sealed = seal_heads(engine, SIGNER)
    assert sealed > 0
    after = verify(log, engine, SIGNER, checkpoint_every=EVERY)
    assert after.ok and after.unsigned_tail == 0 and after.checkpoints == before.checkpoints + sealed
    assert seal_heads(engine, SIGNER) == 0, "a signed head is not sealed again"


def test_a_consistent_rewrite_of_the_tail_passes_unsealed_and_is_caught_once_sealed(trail):
    log, engine, path, _ = trail
    with engine.connect() as conn:
        heads = conn.execute(sa.text('SELECT "partition", max(seq) FROM audit_trail WHERE topic = :t '
                                     'GROUP BY "partition" ORDER BY "partition"'), {"t": TOPIC}).all()
    # Partitions whose head is no record-count checkpoint: their tails are unsigned until sealed.
    unsealed, sealed = [p for p, seq in heads if seq % EVERY][:2]
    rewrite_last_record(engine, path, unsealed)
    assert verify(log, engine, SIGNER, checkpoint_every=EVERY).ok, "unsealed, a consistent rewrite passes"
    seal_heads(engine, SIGNER)
    offset = rewrite_last_record(engine, path, sealed)
    report = verify(log, engine, SIGNER, checkpoint_every=EVERY)
    assert [(f.partition, f.offset, f.kind) for f in report.findings] == [(sealed, offset, "checkpoint_mismatch")]


def test_a_forged_seal_is_caught(trail):
    log, engine, _, partition = trail
    seal_heads(engine, SIGNER)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE audit_seals SET signature = :s WHERE {WHERE}"),
                     {"s": "0" * 64, "t": TOPIC, "p": partition})
    report = verify(log, engine, SIGNER, checkpoint_every=EVERY)
    assert [(f.partition, f.kind) for f in report.findings] == [(partition, "checkpoint_signature")]


def test_the_development_key_is_refused_on_shared_services_only(tmp_path):
    embedded = Settings(home=tmp_path)
    assert dev_key_refused(embedded) is None
    assert dev_key_refused(Settings(home=tmp_path, audit_signing_key="mine", event_log_url="kafka://k:9092")) is None
    why = dev_key_refused(Settings(home=tmp_path, database_url="postgresql+psycopg://u@h/db"))
    assert why and "LEDGERLM_AUDIT_SIGNING_KEY" in why and "database" in why
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERLM_")}
    env.update(PYTHONPATH=str(ROOT), LEDGERLM_HOME=str(tmp_path), LEDGERLM_EVENT_LOG_URL="kafka://127.0.0.1:9")
    started = subprocess.run([sys.executable, "-m", "api.cli", "serve", "projector"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 2, started.stdout + started.stderr
    assert "LEDGERLM_AUDIT_SIGNING_KEY" in started.stderr and "event log" in started.stderr


def test_topics_sealed_are_the_durable_ones(trail):
    _, engine, _, _ = trail
    seal_heads(engine, SIGNER)
    with engine.connect() as conn:
        sealed = {t for (t,) in conn.execute(sa.text("SELECT DISTINCT topic FROM audit_seals"))}
    assert sealed and sealed <= {t.name for t in topics.DURABLE}


def sealed_rows(db_url: str) -> int:
    engine = open_projection_db(db_url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT count(*) FROM audit_seals")).scalar()
    except sa.exc.SQLAlchemyError:  # not migrated yet
        return 0
    finally:
        engine.dispose()


@pytest.fixture
def cli_setup(ledger_dbs, request):
    """`test_projections_cli`'s `setup`: (env, workload, db_url, dbs) of a log to project."""
    return request.getfixturevalue("setup")


@pytest.mark.parametrize("every_s", [0.5, 3600.0])
def test_the_serve_projector_seals_on_time_and_at_shutdown(cli_setup, every_s):
    env, workload, db_url, _ = cli_setup
    env = {**env, "LEDGERLM_AUDIT_SEAL_EVERY_S": str(every_s)}
    with Launched([sys.executable, "-m", "api.cli", "serve", "projector"], env=env,
                  log=Path(env["LEDGERLM_HOME"]) / "projector.log") as projector:
        projector.wait_until(lambda: chained(db_url) >= workload.expected.events, 120, what="the projector to catch up")
        if every_s < 1:  # on time: sealed while it runs
            projector.wait_until(lambda: sealed_rows(db_url), 30, what="a seal while the projector runs")
        else:
            assert sealed_rows(db_url) == 0
        assert projector.stop(timeout_s=60) == 0, projector.shown()
    report = json.loads(ledgerlm(env, "audit", "verify", "--json").stdout)
    assert report["ok"] and report["unsigned_tail"] == 0 and report["not_in_trail"] == 0, report
    assert sealed_rows(db_url) > 0
