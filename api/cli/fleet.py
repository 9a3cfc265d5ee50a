"""`ledgerlm fleet status`: the workers on the fleet topic, read straight from the log
(embedded or Kafka), as `GET /v1/admin/fleet` shows them:

    ledgerlm fleet status [--json] [--pool P] [--revision R] [--since S] [--watch N]

It shows workers heard from within `--since` seconds (default 300): the live and
draining ones, and those that went lost or left in that time.
"""
from __future__ import annotations

import argparse
import signal
import threading
from datetime import datetime

from api.fleet_report import FleetOut, fleet_report
from models.settings import Settings
from pipelines.bootstrap import Bootstrap
from pipelines.fleet import FleetView, wall_clock

# A one-shot status reads the whole look-back window, however long the log takes to answer.
READ_S = 15.0
MAX_RECORDS = 1_000_000


def _report(view: FleetView, args: argparse.Namespace) -> FleetOut:
    return fleet_report(view.refresh().all(), wall_clock(), view.lost_after_s, pool=args.pool, revision=args.revision)


def _age(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.0f}m"


def _time(at: datetime) -> str:
    return at.strftime("%H:%M:%S")


def _hits(queries: int, hits: int) -> str:
    """The prefix cache's hit rate over prompt tokens looked up, 5 wide ('-': none looked up)."""
    return f"{hits / queries * 100:>4.0f}%" if queries else f"{'-':>5}"


def table(report: FleetOut) -> str:
    """The report as text: one line per worker, then one per (pool, revision). KV TOKENS is
    the cache the engine allocated, KV USED what requests hold of it now; PREEMPT and HIT%
    (prefix-cache hits over prompt tokens looked up) count since each worker started."""
    head = (f"{'WORKER':<28} {'POOL':<12} {'REVISION':<24} {'ENGINE':<12} {'STATE':<8} {'RUN':>4} {'WAIT':>4} "
            f"{'FREE':>4} {'SEQS':>5} {'KV TOKENS':>10} {'KV USED':>10} {'MAX LEN':>7} {'KV%':>5} {'PREEMPT':>7} "
            f"{'HIT%':>5} {'TOK/S':>8}  LAST HEARTBEAT")
    lines = [f"fleet as of {report.as_of.isoformat(timespec='seconds')}", head]
    for w in report.workers:
        c, load = w.capacity, w.load
        lines.append(
            f"{w.worker_id:<28} {w.pool:<12} {w.model_revision:<24} {w.engine_config_hash[:12]:<12} {w.status:<8} "
            f"{load.running:>4} {load.waiting:>4} {load.free_slots:>4} {c.max_seqs:>5} {c.kv_cache_tokens:>10} "
            f"{load.kv_tokens_used:>10} {c.max_model_len:>7} {load.kv_cache_usage * 100:>4.0f}% "
            f"{load.preemptions:>7} {_hits(load.prefix_cache_queries, load.prefix_cache_hits)} "
            f"{load.output_tokens_per_s:>8.1f}  {_time(w.last_heartbeat_at)} ({_age(w.last_heartbeat_age_s)} ago)")
    if not report.workers:
        lines.append("(no workers heard from)")
    lines.append("")
    lines.append(f"{'POOL':<12} {'REVISION':<24} {'SERVING':>7} {'FREE':>5} {'SEQS':>5} {'KV TOKENS':>10} "
                 f"{'KV USED':>10} {'RUN':>5} {'WAIT':>5} {'PREEMPT':>7} {'HIT%':>5} {'TOK/S':>8}  OTHERS")
    for p in report.pools:
        others = ", ".join(f"{n} {s}" for s, n in p.by_status.items() if n and s != "live") or "-"
        lines.append(f"{p.pool:<12} {p.model_revision:<24} {p.workers:>7} {p.free_slots:>5} {p.max_seqs:>5} "
                     f"{p.kv_cache_tokens:>10} {p.kv_tokens_used:>10} {p.running:>5} {p.waiting:>5} "
                     f"{p.preemptions:>7} {_hits(p.prefix_cache_queries, p.prefix_cache_hits)} "
                     f"{p.output_tokens_per_s:>8.1f}  {others}")
    return "\n".join(lines)


def show(report: FleetOut, as_json: bool) -> None:
    print(report.model_dump_json() if as_json else table(report), flush=True)


def _fleet(settings: Settings, args: argparse.Namespace) -> int:
    with Bootstrap(settings).event_log() as log, \
            FleetView(log, lost_after_s=args.lost_after, look_back_s=args.since, max_read_s=READ_S,
                      max_records=MAX_RECORDS) as view:
        if args.watch is None:
            show(_report(view, args), args.json)
            return 0
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.is_set():  # with --json, one report a line
            show(_report(view, args), args.json)
            if not args.json:
                print()
            stop.wait(args.watch)
    return 0


def _seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text}")
    return value


def register(verbs) -> dict:
    fleet = verbs.add_parser("fleet", help="the workers serving each pool and revision, their capacity and load")
    fleet.add_argument("action", choices=["status"])
    fleet.add_argument("--json", action="store_true", help="the report as JSON (GET /v1/admin/fleet's shape)")
    fleet.add_argument("--pool", help="only this pool")
    fleet.add_argument("--revision", help="only this model revision")
    fleet.add_argument("--since", type=float, default=300.0,
                       help="also show workers lost or gone within this many seconds (default 300)")
    fleet.add_argument("--lost-after", type=float, default=None,
                       help="declare a worker lost after this many silent seconds (default: 3 of its heartbeats)")
    fleet.add_argument("--watch", type=_seconds, default=None, metavar="SECONDS",
                       help="show it again every SECONDS until interrupted")
    return {"fleet": _fleet}
