"""`ledgerlm fleet status`: the workers on the fleet topic, read straight from the log
(embedded or Kafka), as `GET /v1/admin/fleet` shows them:

    ledgerlm fleet status [--json] [--wide] [--pool P] [--revision R] [--since S] [--lost-after S] [--watch N]

It shows workers heard from within `--since` seconds (default 300): the live and
draining ones, and those that went lost or left in that time. A worker is lost as
admission judges it: silent for `--lost-after` seconds (default the settings'
`worker_lost_after_s`), never less than three of its own heartbeat intervals.

Columns are as wide as their content; worker, pool and revision names longer than
`NAME_CAP` are cut with an ellipsis unless `--wide`. The table ends with a legend.
"""
from __future__ import annotations

import argparse
import signal
import threading
from datetime import datetime

from api.fleet_report import FleetOut, PoolOut, WorkerOut, fleet_report
from models.settings import Settings
from pipelines.bootstrap import Bootstrap
from pipelines.fleet import FleetView, wall_clock

# A one-shot status reads the whole look-back window, however long the log takes to answer.
READ_S = 15.0
MAX_RECORDS = 1_000_000
NAME_CAP = 32  # the widest a worker, pool or revision name is shown without --wide


def _report(view: FleetView, args: argparse.Namespace) -> FleetOut:
    return fleet_report(view.refresh().all(), wall_clock(), view.lost_after_s, pool=args.pool, revision=args.revision)


def _age(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.0f}m"


def _time(at: datetime) -> str:
    return at.strftime("%H:%M:%S")


def _hits(queries: int, hits: int) -> str:
    """The prefix cache's hit rate over prompt tokens looked up ('-': none looked up)."""
    return f"{hits / queries * 100:.0f}%" if queries else "-"


def _fit(text: str, cap: int | None) -> str:
    """`text`, cut to `cap` characters with an ellipsis when longer (None: whole)."""
    return text if cap is None or len(text) <= cap else text[:cap - 1] + "…"


def layout(head: list[str], rows: list[list[str]], names: int, cap: int | None) -> list[str]:
    """`head` and `rows` as lines of columns two spaces apart, each as wide as its widest
    cell. The first `names` columns are names, left-aligned and cut to `cap` characters;
    the others are figures, right-aligned, except the last, which is left as it is."""
    rows = [[_fit(cell, cap) if i < names else cell for i, cell in enumerate(row)] for row in rows]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        padded = [c.ljust(w) if i < names else c.rjust(w) for i, (c, w) in enumerate(zip(cells[:-1], widths))]
        return "  ".join([*padded, cells[-1]])
    return [line(head), *(line(r) for r in rows)]


WORKER_HEAD = ["WORKER", "POOL", "REVISION", "ENGINE", "STATE", "SEQS", "RUNNING", "WAITING", "FREE", "AHEAD",
               "KV TOKENS", "KV USED", "KV%", "MAX LEN", "PREEMPT", "HIT%", "TOK/S", "LAST HEARTBEAT"]
POOL_HEAD = ["POOL", "REVISION", "SERVING", "SEQS", "RUNNING", "WAITING", "FREE", "AHEAD", "KV TOKENS", "KV USED",
             "PREEMPT", "HIT%", "TOK/S", "OTHERS"]


def _worker_row(w: WorkerOut) -> list[str]:
    c, load = w.capacity, w.load
    return [w.worker_id, w.pool, w.model_revision, w.engine_config_hash[:12], w.status, str(c.max_seqs),
            str(load.running), str(load.waiting), str(load.engine_slots_free), str(load.take_ahead_free),
            str(c.kv_cache_tokens), str(load.kv_tokens_used), f"{load.kv_cache_usage * 100:.0f}%",
            str(c.max_model_len), str(load.preemptions), _hits(load.prefix_cache_queries, load.prefix_cache_hits),
            f"{load.output_tokens_per_s:.1f}", f"{_time(w.last_heartbeat_at)} ({_age(w.last_heartbeat_age_s)} ago)"]


def _pool_row(p: PoolOut) -> list[str]:
    others = ", ".join(f"{n} {s}" for s, n in p.by_status.items() if n and s != "live") or "-"
    return [p.pool, p.model_revision, str(p.workers), str(p.max_seqs), str(p.running), str(p.waiting),
            str(p.engine_slots_free), str(p.take_ahead_free), str(p.kv_cache_tokens), str(p.kv_tokens_used),
            str(p.preemptions), _hits(p.prefix_cache_queries, p.prefix_cache_hits), f"{p.output_tokens_per_s:.1f}",
            others]


def _lost_rule(report: FleetOut) -> str:
    if report.lost_after_s is None:
        return "a worker is lost after 3 heartbeat intervals of silence"
    return (f"a worker is lost after {report.lost_after_s:g}s of silence "
            "(3 heartbeat intervals if longer)")


LEGEND = [
    "SEQS     sequences the engine runs at once; RUNNING: of them, now; WAITING: taken or queued, not running",
    "FREE     engine slots free now",
    "AHEAD    take-ahead room: work a worker may still take beyond its engine's sequences, to wait inside",
    "         the engine (LEDGERLM_WORKER_TAKE_AHEAD); FREE + AHEAD is free_slots in the JSON",
    "KV       KV TOKENS: the engine's KV cache, KV USED: what requests hold of it, both in tokens",
    "         (the cache's memory is LEDGERLM_KV_CACHE_GB, in GiB: 2^30 bytes)",
    "PREEMPT  preemptions since the worker started; HIT%: prefix-cache hits over prompt tokens looked up",
    "pools    a pool line sums the workers taking work (live, not draining)",
]


def table(report: FleetOut, *, wide: bool = False) -> str:
    """The report as text: one line per worker, then one per (pool, revision), then what
    the columns mean. Names longer than `NAME_CAP` are cut with an ellipsis unless `wide`."""
    cap = None if wide else NAME_CAP
    lines = [f"fleet as of {report.as_of.isoformat(timespec='seconds')}; {_lost_rule(report)}"]
    lines += layout(WORKER_HEAD, [_worker_row(w) for w in report.workers], 5, cap)
    if not report.workers:
        lines.append("(no workers heard from)")
    lines.append("")
    lines += layout(POOL_HEAD, [_pool_row(p) for p in report.pools], 2, cap)
    if any(len(name) > NAME_CAP for w in report.workers for name in (w.worker_id, w.pool, w.model_revision)) \
            and not wide:
        lines.append(f"(names over {NAME_CAP} characters are cut with '…': --wide shows them whole)")
    return "\n".join([*lines, "", *LEGEND])


def show(report: FleetOut, as_json: bool, wide: bool = False) -> None:
    print(report.model_dump_json() if as_json else table(report, wide=wide), flush=True)


def _fleet(settings: Settings, args: argparse.Namespace) -> int:
    if args.lost_after is None:  # as admission judges workers lost
        args.lost_after = settings.worker_lost_after_s
    with Bootstrap(settings).event_log() as log, \
            FleetView(log, lost_after_s=args.lost_after, look_back_s=args.since, max_read_s=READ_S,
                      max_records=MAX_RECORDS) as view:
        if args.watch is None:
            show(_report(view, args), args.json, args.wide)
            return 0
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.is_set():  # with --json, one report a line
            show(_report(view, args), args.json, args.wide)
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
    fleet = verbs.add_parser(
        "fleet", help="the workers serving each pool and revision, their capacity and load",
        description="The workers serving each pool and revision, their capacity and load. FREE is engine slots "
                    "free now, AHEAD the room left for work taken ahead of the engine (LEDGERLM_WORKER_TAKE_AHEAD). "
                    "KV figures are tokens; the KV cache's memory, LEDGERLM_KV_CACHE_GB, is in GiB (2^30 bytes).")
    fleet.add_argument("action", choices=["status"])
    fleet.add_argument("--json", action="store_true", help="the report as JSON (GET /v1/admin/fleet's shape)")
    fleet.add_argument("--wide", action="store_true",
                       help=f"show names whole (by default those over {NAME_CAP} characters are cut with '…')")
    fleet.add_argument("--pool", help="only this pool")
    fleet.add_argument("--revision", help="only this model revision")
    fleet.add_argument("--since", type=float, default=300.0,
                       help="also show workers lost or gone within this many seconds (default 300)")
    fleet.add_argument("--lost-after", type=_seconds, default=None, metavar="SECONDS",
                       help="declare a worker lost after this many silent seconds, never less than 3 of its "
                            "heartbeat intervals (default: LEDGERLM_WORKER_LOST_AFTER_S, as admission)")
    fleet.add_argument("--watch", type=_seconds, default=None, metavar="SECONDS",
                       help="show it again every SECONDS until interrupted")
    return {"fleet": _fleet}
