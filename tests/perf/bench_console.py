"""The web console's pages against a large projection database on PostgreSQL.

Loads `--rows` usage-ledger rows (a year of them over `--tenants` tenants, each with four
keys, each of one application, over five revisions), `--generations` generation rows and
`--audit-events` audit-trail rows, all by INSERT ... SELECT over generate_series inside
PostgreSQL (no row crosses the client), then fills the daily rollup with the same
statement migration 0009 uses. The API (with the console) is served over an embedded log
holding the tenants and keys; each page is asked for `--repeat` times, one after another,
and its p50 and p95 recorded in tests/perf/RESULTS.md. Then an export of one tenant's year.

    .venv/bin/python tests/perf/bench_console.py                      # 10M rows, 100k audit events
    .venv/bin/python tests/perf/bench_console.py --rows 1000000 --no-record
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from migrations.runner import upgrade  # noqa: E402
from models.settings import Settings  # noqa: E402
from pipelines import admin  # noqa: E402
from tests.conftest import make_log_opener  # noqa: E402
from tests.harness import api_services, serve_api  # noqa: E402
from tests.perf.results import record_run  # noqa: E402

SECTION = "## Web console"
DAYS = 365
FILL_ROLLUP = (
    "INSERT INTO usage_daily (tenant_id, day, application_id, key_id, model_revision, generations, batch_chunks, "
    "cached, input_tokens, output_tokens, delivered_output_tokens, cost_micros) "
    "SELECT tenant_id, day, COALESCE(application_id, ''), COALESCE(key_id, ''), COALESCE(model_revision, ''), "
    "SUM(CASE WHEN source = 'generation' THEN 1 ELSE 0 END), SUM(CASE WHEN source = 'batch_chunk' THEN 1 ELSE 0 END), "
    "SUM(CASE WHEN cached THEN 1 ELSE 0 END), SUM(input_tokens), SUM(output_tokens), "
    "SUM(COALESCE(delivered_output_tokens, output_tokens)), SUM(cost_micros) FROM usage_ledger "
    "GROUP BY tenant_id, day, COALESCE(application_id, ''), COALESCE(key_id, ''), COALESCE(model_revision, '')")


def tenant_of(expr: str, tenants: int) -> str:
    return f"'t' || lpad(({expr} % {tenants})::text, 3, '0')"


def load(url: str, rows: int, generations: int, audit: int, tenants: int) -> dict[str, float]:
    span_s = DAYS * 86400
    t = tenant_of("g", tenants)
    at = f"(timestamptz '2026-01-01 00:00:00+00' + ((g::bigint * {span_s}) / {rows}) * interval '1 second')"
    took = {}
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        started = time.perf_counter()
        conn.execute(sa.text(
            "INSERT INTO usage_ledger (tenant_id, source, source_id, batch_id, application_id, key_id, model_alias, "
            "model_revision, input_tokens, output_tokens, cost_micros, delivered_output_tokens, cached, queued_ms, "
            "ttft_ms, duration_ms, finish_reason, terminal_status, settled_at, day) "
            f"SELECT {t}, 'generation', 'gen_' || g, NULL, 'app' || (((g / 7) % 4) % 3), "
            f"'key_' || {t} || '_' || ((g / 7) % 4), 'tiny', 'rev' || (g % 5), 10 + g % 500, 1 + g % 200, "
            f"(10 + g % 500) * 1000 + (1 + g % 200) * 2000, NULL, CASE WHEN g % 50 = 0 THEN true END, "
            f"g % 40, 20 + g % 90, 100 + g % 900, 'stop', 'completed', {at}, to_char({at} AT TIME ZONE 'UTC', "
            f"'YYYY-MM-DD') FROM generate_series(1, {rows}) g"))
        took["usage_ledger"] = time.perf_counter() - started
        started = time.perf_counter()
        conn.execute(sa.text(FILL_ROLLUP))
        took["usage_daily"] = time.perf_counter() - started
        started = time.perf_counter()
        gat = f"(timestamptz '2026-01-01 00:00:00+00' + ((g::bigint * {span_s}) / {generations}) * interval '1 second')"
        conn.execute(sa.text(
            f"INSERT INTO generations (request_id, tenant_id, application_id, key_id, model_alias, model_revision, "
            f"priority, status, finish_reason, input_tokens, output_tokens, cost_micros, queued_ms, ttft_ms, "
            f"duration_ms, settled, created_at, started_at, ended_at, settled_at) "
            f"SELECT 'gen_' || g, {t}, 'app' || (((g / 7) % 4) % 3), 'key_' || {t} || '_' || ((g / 7) % 4), 'tiny', "
            f"'rev' || (g % 5), 'normal', 'completed', 'stop', 10 + g % 500, 1 + g % 200, 100, g % 40, 20 + g % 90, "
            f"100 + g % 900, true, {gat}, {gat}, {gat}, {gat} FROM generate_series(1, {generations}) g"))
        took["generations"] = time.perf_counter() - started
        started = time.perf_counter()
        event = (f"'{{\"event_type\":\"UsageSettled\",\"tenant_id\":\"' || {t} || '\",\"payload\":{{\"n\":' || g || "
                 f"'}}}}'")
        aat = f"(timestamptz '2026-01-01 00:00:00+00' + ((g::bigint * {span_s}) / {audit}) * interval '1 second')"
        conn.execute(sa.text(
            f"INSERT INTO audit_trail (topic, partition, \"offset\", seq, event_hash, link, event_id, event_type, "
            f"tenant_id, correlation_id, occurred_at, event) SELECT 'ledger', g % 8, g / 8, g / 8 + 1, "
            f"sha256(convert_to({event}, 'UTF8')), sha256(int8send(g)), md5(g::text), 'UsageSettled', {t}, "
            f"'gen_' || g, {aat}, {event} FROM generate_series(0, {audit - 1}) g"))
        took["audit_trail"] = time.perf_counter() - started
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        started = time.perf_counter()
        conn.execute(sa.text("VACUUM ANALYZE"))
        took["vacuum_analyze"] = time.perf_counter() - started
    engine.dispose()
    return took


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def time_page(client: httpx.Client, path: str, repeat: int) -> tuple[float, float, int]:
    for _ in range(2):  # warm: plans cached, pages in the buffer cache
        assert client.get(path).status_code == 200, path
    took = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(path)
        took.append(time.perf_counter() - started)
        assert response.status_code == 200, (path, response.text[:300])
    return quantile(took, 0.5) * 1000, quantile(took, 0.95) * 1000, len(response.content)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--generations", type=int, default=1_000_000)
    parser.add_argument("--audit-events", type=int, default=100_000)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()

    base = os.environ.get("LEDGERLM_TEST_POSTGRES")
    if not base:
        print("LEDGERLM_TEST_POSTGRES is not set: source .local/services.env", file=sys.stderr)
        return 2
    name = "bench_console_" + uuid.uuid4().hex[:8]
    server = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with server.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = base.rsplit("/", 1)[0] + "/" + name
    try:
        upgrade(url)
        loaded = load(url, args.rows, args.generations, args.audit_events, args.tenants)
        print("loaded:", {k: round(v, 1) for k, v in loaded.items()}, flush=True)
        home = Path(tempfile.mkdtemp(prefix="bench-console-"))
        settings = Settings(home=home, database_url=url, bootstrap_token="bench-" + uuid.uuid4().hex)
        opener = make_log_opener("embedded", home)
        log = opener()
        from pipelines.admin.commands import RegistryView

        view = RegistryView(log)
        for i in range(args.tenants):
            admin.create_tenant(view, tenant_id=f"t{i:03d}", name=f"t{i:03d}", actor="bench")
        tenant_admin, _ = admin.issue_key(view, tenant_id="t001", actor="bench", scopes=("tenant_admin",))
        app_services = api_services(settings, opener())
        from api.app import create_app

        app = create_app(app_services)
        http, thread, port = serve_api(app, "bench-console", lifespan="on")
        results = []
        try:
            base_url = f"http://127.0.0.1:{port}"
            pages = {"operator": [
                ("usage, every tenant, 30 days", "/console/usage"),
                ("usage, every tenant, a year, per tenant", "/console/usage?start=2026-01-01&end=2026-12-31"),
                ("usage, every tenant, a year, per day", "/console/usage?start=2026-01-01&end=2026-12-31&group=day"),
                ("usage, one tenant, a year, per key", "/console/usage?tenant=t007&start=2026-01-01&end=2026-12-31"
                                                       "&group=key"),
                ("limits", "/console/limits?tenant=t007"),
                ("generations, every tenant, first page", "/console/generations"),
                ("batches", "/console/batches"),
                ("keys", "/console/keys?tenant=t007"),
                ("audit, every tenant, first page", "/console/audit"),
                ("routing", "/console/routing"),
                ("fleet", "/console/fleet"),
            ], "tenant admin": [
                ("usage, own tenant, a year, per revision", "/console/usage?start=2026-01-01&end=2026-12-31"
                                                            "&group=revision"),
                ("generations, own tenant, first page", "/console/generations"),
                ("audit, own tenant, first page", "/console/audit"),
            ]}
            for who, secret in (("operator", settings.bootstrap_token), ("tenant admin", tenant_admin)):
                with httpx.Client(base_url=base_url, timeout=120) as client:
                    assert client.post("/console/login", data={"api_key": secret}).status_code == 303
                    for label, path in pages[who]:
                        p50, p95, size = time_page(client, path, args.repeat)
                        results.append((who, label, p50, p95, size))
                        print(f"{who:12s} {label:45s} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  {size / 1024:6.0f} KiB",
                              flush=True)
                    if who == "operator":  # a page deep in the list costs what the first one does
                        path = "/console/generations"
                        for _ in range(20):
                            html = client.get(path).text
                            path = "/console/generations" + re.search(r'href="([^"]+)" id="next-page"',
                                                                      html).group(1).replace("&amp;", "&")
                        p50, p95, size = time_page(client, path, args.repeat)
                        results.append((who, "generations, every tenant, 21st page", p50, p95, size))
                        print(f"{who:12s} generations 21st page p50 {p50:.1f} p95 {p95:.1f}", flush=True)
                        started = time.perf_counter()
                        exported = client.get("/console/usage/export?format=csv&tenant=t007&start=2026-01-01"
                                              "&end=2026-12-31")
                        csv_s = time.perf_counter() - started
                        csv_rows = exported.text.count("\n") - 1
                        started = time.perf_counter()
                        parquet = client.get("/console/usage/export?format=parquet&tenant=t007&start=2026-01-01"
                                             "&end=2026-12-31")
                        parquet_s = time.perf_counter() - started
        finally:
            http.should_exit = True
            thread.join(15)
            app_services.log.close()
            log.close()
        worst = max(r[3] for r in results)
        table = ["| who | page | p50 | p95 | HTML |", "|---|---|---:|---:|---:|"]
        table += [f"| {w} | {label} | {p50:.0f} ms | {p95:.0f} ms | {size / 1024:.0f} KiB |"
                  for w, label, p50, p95, size in results]
        table.append(f"\nWorst page p95 {worst:.0f} ms (goal < 1000 ms). Export of one tenant's year: CSV "
                     f"{csv_rows:,} rows in {csv_s:.1f} s ({csv_rows / csv_s:,.0f} rows/s, "
                     f"{len(exported.content) / 2**20:.0f} MiB); Parquet in {parquet_s:.1f} s "
                     f"({len(parquet.content) / 2**20:.0f} MiB). Load: " +
                     ", ".join(f"{k} {v:.0f} s" for k, v in loaded.items()) + ".")
        print("\n".join(table))
        if not args.no_record:
            command = "set -a; . .local/services.env; set +a; .venv/bin/python tests/perf/bench_console.py " + " ".join(
                sys.argv[1:])
            record_run(SECTION, command.strip(), f"{args.rows:,} usage-ledger rows over {args.tenants} tenants and a "
                       f"year, {args.generations:,} generations, {args.audit_events:,} audit events in PostgreSQL; "
                       f"{args.repeat} sequential requests a page after 2 warm-ups, client and API in one process",
                       "\n".join(table))
        return 0 if worst < 1000 else 1
    finally:
        with server.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        server.dispose()


if __name__ == "__main__":
    sys.exit(main())
