"""`ledgerlm rollout ...` and `ledgerlm route drain`: an alias's routing table, changed only
by admin events (`pipelines.rollouts.commands`), printed as JSON lines.

    ledgerlm rollout start ALIAS CANDIDATE [--steps 1,5,25,50,100] [--step-duration 300]
                                           [--shadow] [--min-samples 50] ...
    ledgerlm rollout status [ALIAS] [--all]
    ledgerlm rollout step|pause|resume|promote|rollback ALIAS [--reason TEXT]
    ledgerlm rollout replace ALIAS CANDIDATE
    ledgerlm route drain REVISION
"""
from __future__ import annotations

import argparse
import sys

from api.cli.home import not_found
from models.settings import Settings

GUARDRAIL_FLAGS = {"min_samples": int, "max_ttft_p95_ratio": float, "max_tpot_p95_ratio": float,
                   "max_error_rate_delta": float, "max_timeout_rate_delta": float, "min_median_similarity": float,
                   "max_eval_score_drop": float}


def _steps(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("steps are percentages separated by commas, e.g. 1,5,25,50,100") from None


def register(verbs) -> dict:
    rollout = verbs.add_parser("rollout", help="move an alias to a candidate revision in steps (canary or shadow)")
    action = rollout.add_subparsers(dest="action", required=True)
    start = action.add_parser("start", help="start a rollout of ALIAS to CANDIDATE at its first step")
    start.add_argument("alias")
    start.add_argument("candidate")
    start.add_argument("--steps", type=_steps, default=None, help="traffic shares in percent (default 1,5,25,50,100)")
    start.add_argument("--step-duration", type=float, default=300.0, help="seconds a step lasts (default 300)")
    start.add_argument("--shadow", action="store_true",
                       help="mirror the share to the candidate instead of serving it (clients see stable only)")
    for name, kind in GUARDRAIL_FLAGS.items():
        start.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, dest=name)
    status = action.add_parser("status", help="the open rollouts (or one alias's), with their history")
    status.add_argument("alias", nargs="?")
    status.add_argument("--all", action="store_true", help="ended rollouts too")
    for verb in ("step", "pause", "resume", "promote", "rollback"):
        one = action.add_parser(verb)
        one.add_argument("alias")
        if verb == "rollback":
            one.add_argument("--reason", default="manual")
    replace = action.add_parser("replace", help="go on with another candidate: back to the first step, "
                                                "its analysis afresh")
    replace.add_argument("alias")
    replace.add_argument("candidate")
    route = verbs.add_parser("route", help="routing across aliases")
    drain = route.add_subparsers(dest="action", required=True).add_parser(
        "drain", help="move every alias's traffic off a revision at once")
    drain.add_argument("revision")
    return {"rollout": _run, "route": _run}


class NoRollout(LookupError):
    """`rollout status ALIAS` for an alias without the rollout asked for."""


class NoSuchAlias(NoRollout):
    """`rollout status ALIAS` for an alias the log does not hold: perhaps another log's."""


def _run(settings: Settings, args: argparse.Namespace) -> int:
    from api.cli.admin import print_admin_lines
    from pipelines.rollouts import commands as rollouts

    try:
        return print_admin_lines(settings, lambda view, actor: _lines(rollouts, view, args, actor))
    except NoRollout as exc:
        print(f"error: {not_found(exc, settings) if isinstance(exc, NoSuchAlias) else exc}", file=sys.stderr)
        return 1


def _none_for(registry, alias: str, ended_too: bool) -> NoRollout:
    if alias not in registry.aliases:
        return NoSuchAlias(f"alias {alias!r} does not exist (aliases: {', '.join(sorted(registry.aliases)) or 'none'})")
    if ended_too:
        return NoRollout(f"alias {alias!r} has had no rollout")
    return NoRollout(f"alias {alias!r} has no rollout under way (--all shows ended ones too)")


def _lines(rollouts, view, args, actor: str):
    action = args.action
    if args.verb == "route":
        env, moved = rollouts.drain(view, model_revision=args.revision, actor=actor)
        yield {"drained": args.revision, "aliases": moved, "event_id": str(env.event_id)}
        return
    if action == "start":
        guardrails = {name: getattr(args, name) for name in GUARDRAIL_FLAGS if getattr(args, name) is not None}
        env = rollouts.start(view, alias=args.alias, candidate_revision=args.candidate, actor=actor,
                             mode="shadow" if args.shadow else "canary",
                             steps=args.steps or rollouts.DEFAULT_STEPS, step_duration_s=args.step_duration,
                             guardrails=guardrails)
        yield rollouts.describe(view.refresh().rollouts[env.payload.rollout_id])
    elif action == "status":
        registry = view.refresh()
        shown = registry.rollouts.values() if args.all else registry.open_rollouts.values()
        found = [r for r in sorted(shown, key=lambda r: r.started_at) if args.alias in (None, r.alias)]
        if args.alias is not None and not found:
            raise _none_for(registry, args.alias, args.all)
        for rollout in found:
            yield rollouts.describe(rollout)
    else:
        command = getattr(rollouts, action)
        options = {"reason": args.reason} if action == "rollback" else {}
        if action == "replace":
            options = {"candidate_revision": args.candidate}
        env = command(view, alias=args.alias, actor=actor, **options)
        yield rollouts.describe(view.refresh().rollouts[env.payload.rollout_id])
