"""`ledgerlm` verbs for projections, the audit trail, replay and usage reports:

    ledgerlm projections status|digest|run         lag per projection, table digests, catch up once
    ledgerlm audit verify                          recompute the chains, check trail and signatures
    ledgerlm replay --into DB_URL                  rebuild every projection into an empty database
    ledgerlm usage report --month YYYY-MM --format csv|parquet [--out F] [--plot F.png]
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from api.projector import audit_signer, dev_key_refusal, projection_runner
from models.settings import Settings
from pipelines.bootstrap import Bootstrap

logger = logging.getLogger(__name__)


def _refused(settings: Settings) -> bool:
    refusal = dev_key_refusal(settings)
    if refusal:
        print(refusal, file=sys.stderr)
    return bool(refusal)


def _print_digests(digests, as_json: bool) -> None:
    if as_json:
        print(json.dumps({d.table: {"rows": d.rows, "sha256": d.sha256} for d in digests}, indent=2))
        return
    for d in digests:
        print(f"{d.table:<20} {d.rows:>10}  {d.sha256}")


def _projections(settings: Settings, args: argparse.Namespace) -> int:
    platform = Bootstrap(settings)
    if args.action == "digest":
        from pipelines.audit.digest import table_digests

        engine = platform.projection_db(args.db)
        _print_digests(table_digests(engine), args.json)
        engine.dispose()
        return 0
    if args.action == "run" and _refused(settings):
        return 2
    with platform.event_log() as log:
        runner, engine = projection_runner(settings, log, batch_events=args.batch_events, migrate=args.action == "run")
        try:
            if args.action == "run":
                from pipelines.audit.seal import seal_heads

                applied = runner.run_until_caught_up()
                seal_heads(engine, audit_signer(settings))  # what it chained ends signed
                print(json.dumps({"applied": applied}))
            lags = runner.lag()
        finally:
            engine.dispose()
    per_projection: dict[str, int] = {}
    for lag in lags:
        per_projection[lag.projection] = per_projection.get(lag.projection, 0) + lag.records
    print(json.dumps({"lag_records": per_projection}, indent=2))
    return 0


def _audit(settings: Settings, args: argparse.Namespace) -> int:
    from models.audit_chain import CHECKPOINT_EVERY
    from pipelines.signing import Ed25519Verifier
    from pipelines.audit.verify import verify

    platform = Bootstrap(settings)
    verifier = Ed25519Verifier.from_base64(args.public_key) if args.public_key else audit_signer(settings)
    engine = platform.projection_db(args.db)
    with platform.event_log(create_topics=False) as log:
        report = verify(log, engine, verifier, checkpoint_every=args.checkpoint_every or CHECKPOINT_EVERY)
    engine.dispose()
    summary = {"ok": report.ok, "records": report.records, "partitions": report.partitions,
               "signed_checkpoints": report.checkpoints, "unsigned_tail": report.unsigned_tail,
               "not_in_trail": report.not_in_trail, "seconds": round(report.seconds, 3),
               "findings": [f.__dict__ for f in report.findings]}
    if args.json:
        print(json.dumps(summary, indent=2))
    elif report.ok:
        print(f"OK: {report.records} records in {report.partitions} partitions verified in {report.seconds:.2f}s "
              f"({report.checkpoints} signed checkpoints; {report.unsigned_tail} records after the last one; "
              f"{report.not_in_trail} not chained yet)")
    else:
        print(f"TAMPERED: first mismatch {report.first.line()}")
        for finding in report.findings[1:]:
            print(f"  also {finding.line()}")
    return 0 if report.ok else 1


def _replay(settings: Settings, args: argparse.Namespace) -> int:
    from pipelines.audit.replay import ReplayTargetNotEmpty, replay

    with Bootstrap(settings).event_log(create_topics=False) as log:
        try:
            result = replay(log, args.into, audit_signer(settings), batch_events=args.batch_events)
        except ReplayTargetNotEmpty as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    _print_digests(result.digests, args.json)
    print(f"replayed {result.records} records in {result.seconds:.1f}s ({result.records_per_s:,.0f} records/s)",
          file=sys.stderr)
    return 0


def _usage(settings: Settings, args: argparse.Namespace) -> int:
    from pipelines.projections import reports
    from pipelines.projections.queries import daily_spend, month_bounds, usage_report

    try:
        month_bounds(args.month)
    except ValueError:
        print(f"error: --month {args.month!r} is not YYYY-MM", file=sys.stderr)
        return 2
    engine = Bootstrap(settings).projection_db(args.db)
    try:
        rows = usage_report(engine, args.month)
        out = args.out or f"usage-{args.month}.{args.format}"
        if args.format == "csv" and out == "-":
            reports.write_csv(rows, sys.stdout)
        elif args.format == "csv":
            with open(out, "w", newline="") as f:
                reports.write_csv(rows, f)
        else:
            reports.write_parquet(rows, Path(out))
        if args.plot:
            reports.plot_daily_spend(daily_spend(engine, args.month), Path(args.plot),
                                     title=f"spend per tenant per day, {args.month}")
    finally:
        engine.dispose()
    if out != "-":
        print(json.dumps({"rows": len(rows), "out": out, "plot": args.plot}))
    return 0


def register(verbs) -> dict:
    projections = verbs.add_parser("projections", help="projection lag, digests, catch-up")
    projections.add_argument("action", choices=["status", "digest", "run"])
    projections.add_argument("--db", help="database URL (default: settings.database_url)")
    projections.add_argument("--batch-events", type=int, default=5000)
    projections.add_argument("--json", action="store_true")

    audit = verbs.add_parser("audit", help="the tamper-evident audit trail")
    audit.add_argument("action", choices=["verify"])
    audit.add_argument("--db", help="database holding the trail (default: settings.database_url)")
    audit.add_argument("--public-key", help="verify Ed25519 checkpoints with this public key (urlsafe base64)")
    audit.add_argument("--checkpoint-every", type=int, default=None)
    audit.add_argument("--json", action="store_true")

    replay = verbs.add_parser("replay", help="rebuild every projection from the log into an empty database")
    replay.add_argument("--into", required=True, help="URL of an existing, empty database (create it first)")
    replay.add_argument("--batch-events", type=int, default=5000)
    replay.add_argument("--json", action="store_true")

    usage = verbs.add_parser("usage", help="usage reports for chargeback")
    usage.add_argument("action", choices=["report"])
    usage.add_argument("--month", required=True, help="YYYY-MM (UTC)")
    usage.add_argument("--format", choices=["csv", "parquet"], default="csv")
    usage.add_argument("--out", help="output file (default usage-YYYY-MM.<format>; '-' for CSV on stdout)")
    usage.add_argument("--plot", help="also draw spend per tenant per day into this PNG")
    usage.add_argument("--db", help="database URL (default: settings.database_url)")
    return {"projections": _projections, "audit": _audit, "replay": _replay, "usage": _usage}
