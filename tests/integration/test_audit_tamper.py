"""Tampering with the log or the trail is caught by `audit verify`, at the right place.

The log is the embedded one: its SQLite file is edited directly, as someone with write
access to the disk would. The trail is on PostgreSQL and on SQLite.
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from models import topics
from pipelines.audit.verify import verify
from pipelines.projections.sql import open_projection_db
from tests.integration.conftest_ledger import EVERY, SIGNER, project
from tests.ledger_workload import Workload, append_all

ROOT = Path(__file__).resolve().parents[2]
TOPIC = topics.LEDGER.name
K = 13  # the record tampered with: inside a partition, between two signed checkpoints


@pytest.fixture
def audited(ledger_dbs, tmp_path):
    """An embedded log, its trail built and verified clean; the busiest ledger partition."""
    from pipelines.eventlog import open_event_log
    from pipelines.bootstrap import topic_specs

    path = tmp_path / "eventlog.db"
    log = open_event_log(f"sqlite:///{path}")
    log.ensure_topics(topic_specs())
    workload = Workload(seed=4, tenants=3)
    append_all(log, workload.admin() + workload.generations(120))
    url = ledger_dbs.new()
    project(log, url)
    engine = open_projection_db(url)
    assert verify(log, engine, SIGNER, checkpoint_every=EVERY).ok
    partition = max(range(topics.LEDGER.partitions), key=lambda p: log.end_offset(TOPIC, p))
    assert log.end_offset(TOPIC, partition) > 3 * EVERY
    yield log, engine, path, partition
    engine.dispose()
    log.close()


def edit_log(path: Path, *statements: tuple[str, tuple]) -> None:
    conn = sqlite3.connect(path)
    with conn:
        for sql, params in statements:
            conn.execute(sql, params)
    conn.close()


def value_at(path: Path, partition: int, offset: int) -> bytes:
    conn = sqlite3.connect(path)
    (value,) = conn.execute("SELECT value FROM records WHERE topic = ? AND partition = ? AND offset = ?",
                            (TOPIC, partition, offset)).fetchone()
    conn.close()
    return value


def shift(partition: int, from_offset: int, by: int) -> list[tuple[str, tuple]]:
    """Moves offsets >= from_offset by `by`, through negatives so no key collides midway."""
    where = "topic = ? AND partition = ?"
    return [(f"UPDATE records SET offset = -offset - 1 WHERE {where} AND offset >= ?", (TOPIC, partition, from_offset)),
            (f"UPDATE records SET offset = -offset - 1 + ? WHERE {where} AND offset < 0", (by, TOPIC, partition)),
            (f"UPDATE partition_ends SET next_offset = next_offset + ? WHERE {where}", (by, TOPIC, partition))]


def first_finding(log, engine):
    report = verify(log, engine, SIGNER, checkpoint_every=EVERY)
    assert not report.ok and len(report.findings) == 1, report.findings
    return report.first


def test_an_altered_event_is_caught_at_its_offset(audited):
    log, engine, path, partition = audited
    original = value_at(path, partition, K)
    forged = json.loads(original)
    forged["payload"]["request_id"] = "gen_forged"
    forged = json.dumps(forged, sort_keys=True, separators=(",", ":")).encode()
    edit_log(path, ("UPDATE records SET value = ? WHERE topic = ? AND partition = ? AND offset = ?",
                    (forged, TOPIC, partition, K)))
    found = first_finding(log, engine)
    assert (found.topic, found.partition, found.offset, found.kind) == (TOPIC, partition, K, "event_changed")
    import hashlib

    assert (found.expected, found.found) == (hashlib.sha256(original).hexdigest(), hashlib.sha256(forged).hexdigest())


def test_a_deleted_event_is_caught_where_it_was(audited):
    log, engine, path, partition = audited
    edit_log(path, ("DELETE FROM records WHERE topic = ? AND partition = ? AND offset = ?", (TOPIC, partition, K)),
             *shift(partition, K + 1, -1))
    found = first_finding(log, engine)
    assert (found.partition, found.offset, found.kind) == (partition, K, "event_changed")


def test_a_deleted_event_leaving_a_gap_is_caught_as_missing(audited):
    log, engine, path, partition = audited
    edit_log(path, ("DELETE FROM records WHERE topic = ? AND partition = ? AND offset = ?", (TOPIC, partition, K)))
    found = first_finding(log, engine)
    assert (found.partition, found.offset, found.kind) == (partition, K, "record_missing")


def test_an_inserted_event_is_caught_where_it_went_in(audited):
    log, engine, path, partition = audited
    copy = value_at(path, partition, K + 5)  # a genuine event, replayed a second time
    edit_log(path, *shift(partition, K, +1),
             ("INSERT INTO records (topic, partition, offset, key, value, timestamp_ms) VALUES (?, ?, ?, ?, ?, 0)",
              (TOPIC, partition, K, "forged", copy)))
    found = first_finding(log, engine)
    assert (found.partition, found.offset, found.kind) == (partition, K, "event_changed")


def test_two_reordered_events_are_caught_at_the_first(audited):
    log, engine, path, partition = audited
    a, b = value_at(path, partition, K), value_at(path, partition, K + 1)
    where = "WHERE topic = ? AND partition = ? AND offset = ?"
    edit_log(path, (f"UPDATE records SET value = ? {where}", (b, TOPIC, partition, K)),
             (f"UPDATE records SET value = ? {where}", (a, TOPIC, partition, K + 1)))
    found = first_finding(log, engine)
    assert (found.partition, found.offset, found.kind) == (partition, K, "event_changed")


def test_an_altered_trail_row_is_caught_and_told_apart(audited):
    log, engine, _, partition = audited
    with engine.begin() as conn:
        conn.execute(sa.text('UPDATE audit_trail SET link = :x WHERE topic = :t AND "partition" = :p AND "offset" = :o'),
                     {"x": b"\x00" * 32, "t": TOPIC, "p": partition, "o": K})
    found = first_finding(log, engine)
    assert (found.partition, found.offset, found.kind) == (partition, K, "trail_changed")


def test_a_forged_checkpoint_signature_is_caught(audited):
    log, engine, _, partition = audited
    with engine.begin() as conn:
        conn.execute(sa.text('UPDATE audit_checkpoints SET signature = :s WHERE topic = :t AND "partition" = :p '
                             'AND seq = :q'), {"s": "0" * 64, "t": TOPIC, "p": partition, "q": 2 * EVERY})
    found = first_finding(log, engine)
    assert (found.partition, found.offset, found.kind) == (partition, 2 * EVERY - 1, "checkpoint_signature")


def test_the_cli_names_the_first_mismatch_and_exits_nonzero(audited, tmp_path):
    log, engine, path, partition = audited
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LEDGERLM_EVENT_LOG_URL": f"sqlite:///{path}",
           "LEDGERLM_DATABASE_URL": engine.url.render_as_string(hide_password=False),
           "LEDGERLM_AUDIT_SIGNING_KEY": "test-audit-key", "LEDGERLM_HOME": str(tmp_path)}
    command = [sys.executable, "-m", "api.cli", "audit", "verify", "--checkpoint-every", str(EVERY)]
    clean = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0 and clean.stdout.startswith("OK:"), clean.stdout + clean.stderr

    edit_log(path, ("UPDATE records SET value = ? WHERE topic = ? AND partition = ? AND offset = ?",
                    (b'{"forged":true}', TOPIC, partition, K)))
    tampered = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    assert f"first mismatch {TOPIC}[{partition}]@{K}: event_changed" in tampered.stdout


def test_a_removed_topic_is_caught(audited):
    log, engine, path, _ = audited
    edit_log(path, ("DELETE FROM records WHERE topic = ?", (topics.OUTCOMES.name,)),
             ("DELETE FROM partition_ends WHERE topic = ?", (topics.OUTCOMES.name,)),
             ("DELETE FROM topics WHERE name = ?", (topics.OUTCOMES.name,)))
    report = verify(log, engine, SIGNER, checkpoint_every=EVERY)
    assert report.findings and {(f.topic, f.kind) for f in report.findings} == {(topics.OUTCOMES.name,
                                                                                  "record_missing")}
