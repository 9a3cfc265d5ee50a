"""`ledgerlm loadtest`: drives an OpenAI-compatible endpoint with a workload file and
writes the latency-throughput figures per step and tenant:

    ledgerlm loadtest WORKLOAD.yaml --target http://127.0.0.1:8000 [--sweep-rates 1,2,4,8]
        [--rate R | --concurrency C | --sweep-concurrency 1,2,4] [--duration S] [--out DIR]
        [--name NAME] [--replicas N] [--compare OTHER.json ...]

It writes DIR/<name>.json (the result `ledgerlm capacity plan` reads), DIR/<name>.csv and
DIR/<name>-frontier.png (with the --compare results as lines of their own).
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from models.settings import Settings


def _numbers(kind):
    def parse(text: str) -> list:
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a list of numbers: {text}") from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"not a list of positive numbers: {text}")
        return values
    return parse


def apply_options(workload, args: argparse.Namespace) -> None:
    """Command-line options override the workload file's own."""
    mode = workload.mode
    if args.rate is not None:
        mode.kind, mode.rate = "rate", args.rate
    elif args.concurrency is not None:
        mode.kind, mode.concurrency = "concurrency", args.concurrency
    elif args.sweep_rates:
        mode.kind, mode.rates, mode.concurrencies = "sweep", args.sweep_rates, []
    elif args.sweep_concurrency:
        mode.kind, mode.rates, mode.concurrencies = "sweep", [], args.sweep_concurrency
    if args.duration is not None:
        mode.duration_s = args.duration
    if args.model:
        workload.model = args.model
    if args.api:
        workload.api = args.api
    if args.no_stream:
        workload.stream = False
    if args.seed is not None:
        workload.seed = args.seed


def summary(result: dict) -> str:
    lines = [f"{result['target']}: knee at step {result['knee']} ({result['knee_reason']})",
             f"{'STEP':>4} {'LOAD':>10} {'REQ/S':>7} {'TOK/S':>8} {'GOOD REQ/S':>10} {'TTFT P95':>9} "
             f"{'TPOT P95':>9} {'SLO':>4}  REJECTED / FAILED"]
    for i, s in enumerate(result["steps"]):
        load = f"{s['rate']}/s" if s["mode"] == "rate" else f"c={s['concurrency']}"
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(s["rejections"].items())) or "-"
        lines.append(f"{i:>4} {load:>10} {s['requests_per_s']:>7.2f} {s['output_tokens_per_s']:>8.1f} "
                     f"{s['goodput_requests_per_s']:>10.2f} {s['ttft_ms']['p95'] or 0:>9.1f} "
                     f"{s['tpot_ms']['p95'] or 0:>9.2f} {'yes' if s['meets_slo'] else 'no':>4}  "
                     f"{rejected} / {s['failures']}")
    return "\n".join(lines)


def _loadtest(_: Settings, args: argparse.Namespace) -> int:
    from api.loadtest import WorkloadError, load, report, run

    try:
        workload = load(args.workload)
        apply_options(workload, args)
        name = args.name or re.sub(r"[^A-Za-z0-9_.-]+", "_", args.target.split("//")[-1]).strip("_")
        result = run(workload, args.target, target_name=name, replicas=args.replicas, timeout_s=args.timeout,
                     show_progress=not args.no_progress)
    except WorkloadError as exc:
        raise SystemExit(f"ledgerlm loadtest: {exc}") from None
    paths = report.write(result, args.out, stem=name)
    others = [json.loads(Path(p).read_text()) for p in args.compare]
    paths["png"] = report.plot([result, *others], args.out / f"{name}-frontier.png")
    print(summary(result))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def register(verbs) -> dict:
    p = verbs.add_parser("loadtest", help="drive an OpenAI-compatible endpoint with a workload; the frontier")
    p.add_argument("workload", type=Path, help="workload file (YAML or JSON)")
    p.add_argument("--target", required=True, help="base URL of the endpoint, e.g. http://127.0.0.1:8000")
    p.add_argument("--name", help="the target's name in the results (default: from the URL)")
    p.add_argument("--replicas", type=int, default=1, help="engine replicas that served the target (default 1)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, help="fixed rate, requests/s")
    load.add_argument("--concurrency", type=int, help="fixed concurrency")
    load.add_argument("--sweep-rates", type=_numbers(float), metavar="R1,R2,...", help="sweep over rising rates")
    load.add_argument("--sweep-concurrency", type=_numbers(int), metavar="C1,C2,...",
                      help="sweep over rising concurrencies")
    p.add_argument("--duration", type=float, help="seconds per step (default: the workload's, else 30)")
    p.add_argument("--model", help="the model name to send (default: the workload's)")
    p.add_argument("--api", choices=["chat", "completions"], help="route (default: the workload's, else chat)")
    p.add_argument("--no-stream", action="store_true", help="ask for whole responses")
    p.add_argument("--seed", type=int, help="random seed (default: the workload's, else 0)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one request may take (default 300)")
    p.add_argument("--out", type=Path, default=Path("loadtest-results"), help="output folder")
    p.add_argument("--compare", nargs="*", default=[], metavar="RESULT.json",
                   help="earlier results drawn on the same frontier plot")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return {"loadtest": _loadtest}
