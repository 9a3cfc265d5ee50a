"""Replay and verify benchmark: N events (default 1,000,000) of a realistic mix.

    .venv/bin/python tests/perf/bench_replay.py [--events N] [--postgres URL] [--no-sqlite] [--no-postgres]

The log is generated once with the real event classes (tests/ledger_workload.py) into
an embedded log cached under .local/bench/. Each run replays it, as `ledgerlm replay`
does, into a fresh PostgreSQL database (LEDGERLM_TEST_POSTGRES or --postgres; a
superuser URL, a database is created and dropped) and into a fresh SQLite file, printing
records/s and the CPU seconds spent by this process and (PostgreSQL) by its server
backend, then verifies the chain of each (seconds). On a shared machine wall-clock
numbers follow the load; CPU seconds much less. Results go to stdout as JSON;
tests/perf/RESULTS.md has past runs.
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

from migrations.runner import upgrade  # noqa: E402
from pipelines.audit.digest import table_digests  # noqa: E402
from pipelines.signing import HmacSigner  # noqa: E402
from pipelines.audit.verify import verify  # noqa: E402
from pipelines.projections import all_projections  # noqa: E402
from pipelines.projections.runner import ProjectionRunner  # noqa: E402
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


def backend_cpu_s(engine) -> float | None:
    """CPU seconds used so far by the PostgreSQL backend behind the engine's (one, pooled)
    connection, read from /proc: the server runs on this machine."""
    if engine.dialect.name != "postgresql":
        return None
    with engine.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_one(label: str, log_path: Path, db_url: str, batch_events: int) -> dict:
    """`ledgerlm replay` step by step, so the database server's CPU can be read too."""
    signer = HmacSigner(b"bench-key")
    log = open_event_log(f"sqlite:///{log_path}")
    upgrade(db_url)
    engine = open_projection_db(db_url, pool_size=1, max_overflow=0) if label == "postgresql" \
        else open_projection_db(db_url)
    runner = ProjectionRunner(log, engine, all_projections(signer), batch_events=batch_events)
    server_cpu = backend_cpu_s(engine)
    started, cpu = time.perf_counter(), time.process_time()
    records = runner.run_until_caught_up()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    if server_cpu is not None:
        server_cpu = backend_cpu_s(engine) - server_cpu
    print(f"  {label}: replayed {records:,} in {seconds:.1f}s = {records / seconds:,.0f}/s "
          f"(cpu: this process {cpu:.1f}s, database server {server_cpu or 0:.1f}s)", file=sys.stderr)
    verify_cpu = time.process_time()
    report = verify(log, engine, signer)
    verify_cpu = time.process_time() - verify_cpu
    digests = table_digests(engine)
    engine.dispose()
    log.close()
    print(f"  {label}: verified {report.records:,} in {report.seconds:.1f}s, ok={report.ok}", file=sys.stderr)
    return {"database": label, "load_average": round(os.getloadavg()[0], 1), "records": records,
            "replay_s": round(seconds, 2), "records_per_s": round(records / seconds),
            "replay_cpu_s": round(cpu, 1),
            "server_cpu_s": None if server_cpu is None else round(server_cpu, 1),
            "verify_s": round(report.seconds, 2), "verify_cpu_s": round(verify_cpu, 1), "verify_ok": report.ok,
            "rows": {d.table: d.rows for d in digests}}


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
