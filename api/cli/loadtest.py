"""`ledgerlm loadtest`: drives an OpenAI-compatible endpoint with a workload file and
writes the latency-throughput figures per step and tenant:

    ledgerlm loadtest WORKLOAD.yaml --target http://127.0.0.1:8000 [--sweep-rates 1,2,4,8]
        [--rate R | --concurrency C | --sweep-concurrency 1,2,4] [--steps N] [--duration S]
        [--make-tenants] [--out DIR] [--name NAME] [--replicas N] [--compare OTHER.json ...]

A tenant whose key is to come from a variable that is not set gets a tenant of its own on
the platform (made through the admin API, or reused) and a fresh key, when the platform
admin's token is in LEDGERLM_BOOTSTRAP_TOKEN; `--make-tenants` does so for every tenant.

It writes DIR/<name>.json (the result `ledgerlm capacity plan` reads), DIR/<name>.csv and
DIR/<name>-frontier.png (with the --compare results as lines of their own). Steps are
numbered from 1, in the table, the files and the plan alike.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
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


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text}") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value
    return parse


_positive_int, _positive_float = _positive(int), _positive(float)


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
    if getattr(args, "steps", None) is not None:  # callers with parsers of their own may lack it
        if mode.kind != "sweep":
            raise _workload_error("--steps applies to a sweep (--sweep-rates, --sweep-concurrency or the file's)")
        mode.rates, mode.concurrencies = sorted(mode.rates)[:args.steps], sorted(mode.concurrencies)[:args.steps]
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


def _workload_error(text: str):
    from api.loadtest import WorkloadError

    return WorkloadError(text)


def plan_line(workload, target: str) -> str:
    """What the run will do, said before it starts: `N steps of D s each`."""
    from api.loadtest import steps_of

    steps = steps_of(workload.mode)
    loads = ", ".join(f"{r:g}" if kind == "rate" else f"{c}" for kind, r, c in steps)
    unit = "requests/s" if steps[0][0] == "rate" else "concurrent"
    return (f"ledgerlm loadtest: {len(steps)} step{'s' if len(steps) > 1 else ''} of "
            f"{workload.mode.duration_s:g} s each ({loads} {unit}) against {target}")


def summary(result: dict) -> str:
    knee = "no knee" if result["knee"] is None else f"knee at step {result['knee']}"
    lines = [f"{result['target']}: {knee} ({result['knee_reason']})",
             f"{'STEP':>4} {'LOAD':>10} {'REQ/S':>7} {'TOK/S':>8} {'GOOD REQ/S':>10} {'TTFT P95':>9} "
             f"{'TPOT P95':>9} {'SLO':>4}  REJECTED / FAILED"]
    for number, s in enumerate(result["steps"], start=1):
        load = f"{s['rate']}/s" if s["mode"] == "rate" else f"c={s['concurrency']}"
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(s["rejections"].items())) or "-"
        lines.append(f"{number:>4} {load:>10} {s['requests_per_s']:>7.2f} {s['output_tokens_per_s']:>8.1f} "
                     f"{s['goodput_requests_per_s']:>10.2f} {s['ttft_ms']['p95'] or 0:>9.1f} "
                     f"{s['tpot_ms']['p95'] or 0:>9.2f} {'yes' if s['meets_slo'] else 'no':>4}  "
                     f"{rejected} / {s['failures']}")
    return "\n".join(lines)


def provide_keys(workload, args: argparse.Namespace, admin_token: str | None) -> None:
    """Keys for the tenants that lack one (or, with --make-tenants, for every tenant): the
    load test's own tenants on the platform, made with the admin token."""
    from api.loadtest.tenants import provide_keys as make
    from api.loadtest.workload import missing_keys

    wanted = list(workload.tenants) if args.make_tenants else missing_keys(workload)
    if not wanted:
        return
    if not admin_token:
        if args.make_tenants:
            raise _workload_error("--make-tenants needs the platform admin's token: set LEDGERLM_BOOTSTRAP_TOKEN")
        variables = ", ".join(f"${t.key_env}" for t in wanted)
        raise _workload_error(f"no API key for tenant{'s' if len(wanted) > 1 else ''} "
                              f"{', '.join(t.name for t in wanted)}: set {variables}, or set "
                              "LEDGERLM_BOOTSTRAP_TOKEN (the platform admin's token) to make the load test's own tenants")
    made = make(workload, wanted, args.target, admin_token, prefix=args.tenant_prefix)
    print("ledgerlm loadtest: tenants " + ", ".join(
        f"{m.tenant_id} ({'made' if m.created else 'reused'})" for m in made) + ", each with a fresh key", flush=True)


def _loadtest(settings: Settings, args: argparse.Namespace) -> int:
    from api.loadtest import WorkloadError, load, report, run

    try:
        workload = load(args.workload, allow_missing_keys=True)
        apply_options(workload, args)
        provide_keys(workload, args, settings.bootstrap_token)
        name = args.name or re.sub(r"[^A-Za-z0-9_.-]+", "_", args.target.split("//")[-1]).strip("_")
        print(plan_line(workload, args.target), flush=True)
        result = run(workload, args.target, target_name=name, replicas=args.replicas, timeout_s=args.timeout,
                     show_progress=not args.no_progress)
    except WorkloadError as exc:
        print(f"ledgerlm loadtest: error: {exc}", file=sys.stderr)
        return 2
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
    p.add_argument("--steps", type=_positive_int, metavar="N",
                   help="run only the sweep's first N steps (its lowest rates or concurrencies)")
    p.add_argument("--duration", type=_positive_float, metavar="SECONDS",
                   help="seconds each step sends for (default: the workload's, else 30); a sweep of N steps "
                        "takes about N times this, plus the last answers of each step")
    p.add_argument("--make-tenants", action="store_true",
                   help="make the load test's own tenants on the platform (or reuse them) and send with fresh "
                        "keys, for every tenant of the workload; needs LEDGERLM_BOOTSTRAP_TOKEN. Without it, "
                        "only tenants whose api_key_env is not set get one, when the token is set")
    p.add_argument("--tenant-prefix", default="loadtest-", metavar="PREFIX",
                   help="the made tenants' ids: PREFIX + the workload's tenant name (default loadtest-)")
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
