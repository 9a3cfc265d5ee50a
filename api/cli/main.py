"""The `ledgerlm` command. Verbs translate arguments into a call of a handler. `serve NAME`
runs one of the platform's processes as `api.cli.processes` declares it; the model tools
(`model ...`) are carried out by `python -m workers`, a separate entrypoint."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from api.cli import home
from api.cli.admin import add_admin_parser
from api.cli.processes import PROCESSES, add_serve_parser, serve
from models.settings import Settings
from pipelines.log_level import configure_logging


def _admin(settings: Settings, args: argparse.Namespace) -> int:
    from api.cli.admin import run_admin

    return run_admin(settings, args)


def _db(settings: Settings, args: argparse.Namespace) -> int:
    from migrations.runner import downgrade, upgrade

    (upgrade if args.action == "upgrade" else downgrade)(settings.database_url, args.revision)
    return 0


def _demo(settings: Settings, _: argparse.Namespace) -> int:
    from api.demo import run_demo

    return run_demo(settings, PROCESSES)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ledgerlm", description="event-sourced multi-tenant LLM platform")
    sub = parser.add_subparsers(dest="verb", required=True)

    add_serve_parser(sub)

    add_admin_parser(sub)

    db = sub.add_parser("db", help="schema migrations of the projection database")
    db.add_argument("action", choices=["upgrade", "downgrade"])
    db.add_argument("revision", nargs="?", default=None)

    sub.add_parser("model", help="model tools (make-tiny DIR, prepare-small, approve, sign DIR, keygen)", add_help=False)
    sub.add_parser("demo", help="run one streaming generation on the embedded defaults")
    return parser


HANDLERS = {"admin": _admin, "db": _db, "demo": _demo}
# Feature modules add their own verbs: each has `register(subparsers) -> {verb: handler}`.
FEATURE_MODULES: list[str] = ["api.cli.ledger", "api.cli.batch", "api.cli.fleet", "api.cli.capacity", "api.cli.loadtest",
                              "api.cli.rollout", "api.cli.slo"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        configure_logging()
    except ValueError as exc:  # a level that is none
        print(f"ledgerlm: {exc}", file=sys.stderr)
        return 2
    if argv[:1] == ["model"]:
        home.announce_model_tool(argv)
        os.execv(sys.executable, [sys.executable, "-m", "workers", *argv])
    parser = build_parser()
    handlers = dict(HANDLERS)
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    for name in FEATURE_MODULES:
        handlers.update(importlib.import_module(name).register(verbs))
    args = parser.parse_args(argv)
    settings = Settings()
    refused = home.announce(settings, args)
    if refused is not None:
        return refused
    if args.verb == "serve":
        return serve(settings, args, parser)
    return handlers[args.verb](settings, args)


