"""Replay and verify benchmark: N events (default 1,000,000) of a realistic mix.

    .venv/bin/python tests/perf/bench_replay.py [--events N] [--postgres URL] [--no-sqlite] [--no-postgres]

The log is generated once with the real event classes (tests/ledger_workload.py) into
an embedded log cached under .local/bench/. Each run replays it into a fresh PostgreSQL
database (LEDGERLM_TEST_POSTGRES or --postgres; a superuser URL, a database is created
and dropped) and into a fresh SQLite file, printing records/s, then verifies the chain
of each (seconds). Results go to stdout as JSON; tests/perf/RESULTS.md has past runs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine  # noqa: E402

from pipelines.audit.signing import HmacSigner  # noqa: E402
from pipelines.audit.replay import replay  # noqa: E402
from pipelines.audit.verify import verify  # noqa: E402
from pipelines.bootstrap import topic_specs  # noqa: E402
from pipelines.eventlog import open_event_log  # noqa: E402
from pipelines.projections.sql import open_projection_db  # noqa: E402
from tests.ledger_workload import Workload, append_all  # noqa: E402

BENCH = ROOT / ".local" / "bench"
EVENTS_PER_GENERATION = 6.9  # measured mean of the workload's mix, batches and admin included


def build_log(events: int) -> Path:
    path = BENCH / f"replay-{events}.db"
    done = path.with_suffix(".done")
    if done.exists():
        return path
    BENCH.mkdir(parents=True, exist_ok=True)
    for stale in BENCH.glob(f"replay-{events}.db*"):
        stale.unlink()
    log = open_event_log(f"sqlite:///{path}")
    log.ensure_topics(topic_specs())
    workload = Workload(seed=11, tenants=40, span=timedelta(days=28))
    started = time.perf_counter()
    written = append_all(log, workload.admin())
    generations = int(events / EVENTS_PER_GENERATION)
    step = 20_000
    for start in range(0, generations, step):
        written += append_all(log, workload.generations(min(step, generations - start), start, generations))
        print(f"  generated {written:,} events", file=sys.stderr, end="\r")
    log.close()
    done.write_text(json.dumps({"events": written, "seconds": round(time.perf_counter() - started, 1)}))
    print(f"\n  log: {written:,} events in {path}", file=sys.stderr)
    return path


def fresh_postgres(url: str) -> tuple[str, callable]:
    name = "bench_" + uuid.uuid4().hex[:10]
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')

    def drop():
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    return url.rsplit("/", 1)[0] + "/" + name, drop


def run_one(label: str, log_path: Path, db_url: str, batch_events: int) -> dict:
    signer = HmacSigner(b"bench-key")
    log = open_event_log(f"sqlite:///{log_path}")
    result = replay(log, db_url, signer, batch_events=batch_events)
    print(f"  {label}: replayed {result.records:,} in {result.seconds:.1f}s = {result.records_per_s:,.0f}/s",
          file=sys.stderr)
    engine = open_projection_db(db_url)
    report = verify(log, engine, signer)
    engine.dispose()
    log.close()
    print(f"  {label}: verified {report.records:,} in {report.seconds:.1f}s, ok={report.ok}", file=sys.stderr)
    return {"database": label, "load_average": round(os.getloadavg()[0], 1), "records": result.records, "replay_s": round(result.seconds, 2),
            "records_per_s": round(result.records_per_s), "verify_s": round(report.seconds, 2),
            "verify_ok": report.ok, "rows": {d.table: d.rows for d in result.digests}}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--postgres", default=os.environ.get("LEDGERLM_TEST_POSTGRES"))
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--batch-events", type=int, default=5000)
    args = parser.parse_args()
    log_path = build_log(args.events)
    results = {"events": json.loads(log_path.with_suffix(".done").read_text())["events"],
               "machine": f"{platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}",
               "load_average_before": round(os.getloadavg()[0], 1), "runs": []}
    if not args.no_postgres:
        if not args.postgres:
            parser.error("LEDGERLM_TEST_POSTGRES is not set; pass --postgres URL or --no-postgres")
        url, drop = fresh_postgres(args.postgres)
        try:
            results["runs"].append(run_one("postgresql", log_path, url, args.batch_events))
        finally:
            drop()
    if not args.no_sqlite:
        db = BENCH / f"replay-target-{uuid.uuid4().hex[:8]}.db"
        try:
            results["runs"].append(run_one("sqlite", log_path, f"sqlite:///{db}", args.batch_events))
        finally:
            for path in BENCH.glob(db.name + "*"):
                path.unlink()
    results["load_average_after"] = round(os.getloadavg()[0], 1)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
