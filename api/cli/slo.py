"""`ledgerlm slo report`: latency objectives per revision and prompt class, the
availability of admitted requests and admission's rejections, from the projections (so a
replay of the log gives the same report):

    ledgerlm slo report [--window 1h] [--revision R] [--until ISO-TIME] [--json] [--db URL]

It covers the generations requested in the window that ends at `--until` (default now).
What each figure counts is written in `pipelines.projections.slo`.
"""
from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone

from models.prompt_class import PromptThresholds
from models.settings import Settings
from pipelines.bootstrap import Bootstrap
from pipelines.projections.slo import Availability, SloReport, parse_window, slo_report


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def _availability_line(a: Availability) -> str:
    return (f"{a.model_revision or 'all':<24} {a.prompt_class or 'all':<7} {a.admitted:>8} {a.completed:>9} "
            f"{a.failed:>6} {a.expired:>7} {a.cancelled:>9} {a.cancelled_by_client:>9} {a.in_flight:>9}  "
            f"{share(a.availability):>12}")


def table(report: SloReport, window: str) -> str:
    t = report.thresholds
    lines = [f"SLO report: generations requested from {report.since.isoformat(timespec='seconds')} to "
             f"{report.until.isoformat(timespec='seconds')} ({window}), {report.revision or 'every revision'}",
             f"prompt classes: short up to {t.short_max_tokens} input tokens, long from {t.long_min_tokens}, "
             f"medium between", "",
             "LATENCY (completed engine runs; TTFT includes the wait after admission)",
             f"{'REVISION':<24} {'CLASS':<7} {'COMPLETED':>9} {'TTFT P95 MS':>11} {'TPOT P95 MS':>11}"]
    lines += [f"{x.model_revision:<24} {x.prompt_class:<7} {x.generations:>9} {_ms(x.ttft_p95_ms):>11} "
              f"{_ms(x.tpot_p95_ms):>11}" for x in report.latency] or ["(no completed generations)"]
    lines += ["", "AVAILABILITY (completed / admitted and ended; cancels by the client and work in flight left out)",
              f"{'REVISION':<24} {'CLASS':<7} {'ADMITTED':>8} {'COMPLETED':>9} {'FAILED':>6} {'EXPIRED':>7} "
              f"{'CANCELLED':>9} {'BY CLIENT':>9} {'IN FLIGHT':>9}  {'AVAILABILITY':>12}"]
    lines += [_availability_line(a) for a in report.availability + report.by_revision]
    lines.append(_availability_line(report.total))
    by_reason = report.rejections_by_reason()
    lines += ["", "REJECTIONS BY REASON (not admitted, so in no availability)",
              f"{'REASON':<24} {'SHORT':>7} {'MEDIUM':>7} {'LONG':>7} {'ALL':>7}"]
    lines += [f"{reason:<24} {c.get('short', 0):>7} {c.get('medium', 0):>7} {c.get('long', 0):>7} {c['all']:>7}"
              for reason, c in by_reason.items()] or ["(none)"]
    return "\n".join(lines)


def _until(text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO time: {text!r} (e.g. 2025-07-01T12:00:00Z)") from None
    return at.replace(tzinfo=timezone.utc) if at.tzinfo is None else at.astimezone(timezone.utc)


def _window(text: str) -> str:
    try:
        parse_window(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _slo(settings: Settings, args: argparse.Namespace) -> int:
    until = args.until or datetime.now(timezone.utc)
    engine = Bootstrap(settings).projection_db(args.db)
    try:
        report = slo_report(engine, since=until - parse_window(args.window), until=until,
                            thresholds=PromptThresholds.from_settings(settings), revision=args.revision)
    finally:
        engine.dispose()
    print(json.dumps(report.as_dict(), indent=2) if args.json else table(report, args.window), flush=True)
    return 0


def register(verbs) -> dict:
    slo = verbs.add_parser("slo", help="latency per revision and prompt class, availability and rejections")
    slo.add_argument("action", choices=["report"])
    slo.add_argument("--window", type=_window, default="1h",
                     help="how far back from --until: 90s, 15m, 1h, 7d or seconds (default 1h)")
    slo.add_argument("--until", type=_until, default=None, help="end of the window, ISO time (default now, UTC)")
    slo.add_argument("--revision", help="only this model revision")
    slo.add_argument("--json", action="store_true", help="the report as JSON")
    slo.add_argument("--db", help="database URL (default: settings.database_url)")
    return {"slo": _slo}
