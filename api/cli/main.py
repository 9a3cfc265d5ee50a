"""The `ledgerlm` command. Verbs translate arguments into a call of a handler; verbs that
run inference (`serve worker`, `model ...`) are carried out by `python -m workers`, a
separate entrypoint, so this module never imports the engine."""
from __future__ import annotations

import argparse
import json
import importlib
import logging
import os
import signal
import sys
import threading
from datetime import timedelta

from api.cli.admin import add_admin_parser
from models.settings import Settings
from pipelines.process_tuning import tune_process

# Long-running processes offered by feature modules: {name: handler(settings, args)}.
SERVE_HANDLERS: dict = {}


def _serve_projector(settings: Settings, args: argparse.Namespace) -> int:
    from api.cli.ledger import serve_projector

    return serve_projector(settings, args)


SERVE_HANDLERS["projector"] = _serve_projector


def _serve_rollouts(settings: Settings, _: argparse.Namespace) -> int:
    """The rollout guardrails (`pipelines.rollouts.controller`), until SIGINT or SIGTERM."""
    from pipelines.bootstrap import Bootstrap
    from pipelines.outage import exit_on_fatal, is_transient
    from pipelines.rollouts.controller import RolloutController
    from pipelines.cache.similarity import Embedder, model_dir

    platform = Bootstrap(settings)
    log = platform.event_log()
    controller = RolloutController(log, platform.registry_view(log),
                                   embedder=Embedder(model_dir(settings.home)))
    stop = _stop_on_signal()
    print(json.dumps({"rollouts": "ready"}), flush=True)
    try:
        while not stop.is_set():
            try:
                controller.run_once(0.2)
            except Exception as exc:  # a log away now may answer next time
                if not is_transient(exc):
                    raise
                stop.wait(1.0)
    except Exception as exc:
        return exit_on_fatal("rollouts", exc)
    finally:
        controller.close()
        log.close()
    return 0


SERVE_HANDLERS["rollouts"] = _serve_rollouts


def _serve_batch(settings: Settings, args: argparse.Namespace) -> int:
    from api.cli import batch as cli_batch

    serve = cli_batch.serve_dispatcher if args.process == "batch-dispatcher" else cli_batch.serve_worker
    return serve(settings)


SERVE_HANDLERS["batch-dispatcher"] = SERVE_HANDLERS["batch-worker"] = _serve_batch


def _serve_api(settings: Settings, _: argparse.Namespace) -> int:
    import uvicorn

    from api.app import build_services, create_app

    app = create_app(build_services(settings))
    uvicorn.run(app, host=settings.api_host, port=settings.api_port, log_level="warning")
    return 0


def _stop_on_signal() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _serve_admission(settings: Settings, _: argparse.Namespace) -> int:
    from pipelines.admission.processor import AdmissionProcessor
    from pipelines.bootstrap import Bootstrap
    from pipelines.admission.capacity import QueueBound
    from pipelines.admission.metrics import AdmissionMetrics
    from pipelines.metrics import serve_metrics
    from pipelines.outage import Readiness, exit_on_fatal, readiness_registry

    platform = Bootstrap(settings)
    log = platform.event_log()
    metrics = AdmissionMetrics.from_settings(settings)
    readiness = Readiness("admission")
    processor = AdmissionProcessor(log, platform.registry_view(log), grace=timedelta(seconds=settings.grace_s),
                                   on_written=metrics.written, lost_after_s=settings.worker_lost_after_s,
                                   queue_bound=QueueBound.from_settings(settings), floors=platform.service_floors(),
                                   affinity_slack=settings.work_affinity_slack)
    server = serve_metrics(settings, metrics.follow(processor).registry, readiness_registry(readiness))
    stop = _stop_on_signal()
    try:
        processor.run(stop, readiness)  # transient log errors are waited out inside
    except Exception as exc:
        return exit_on_fatal("admission", exc)
    finally:
        processor.close()
        log.close()
        if server is not None:
            server.close()
    return 0


def _admin(settings: Settings, args: argparse.Namespace) -> int:
    from api.cli.admin import run_admin

    return run_admin(settings, args)


def _db(settings: Settings, args: argparse.Namespace) -> int:
    from migrations.runner import downgrade, upgrade

    (upgrade if args.action == "upgrade" else downgrade)(settings.database_url, args.revision)
    return 0


def _demo(settings: Settings, _: argparse.Namespace) -> int:
    from api.demo import run_demo

    return run_demo(settings)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ledgerlm", description="event-sourced multi-tenant LLM platform")
    sub = parser.add_subparsers(dest="verb", required=True)

    serve = sub.add_parser("serve", help="run one of the platform's processes")
    serve.add_argument("process", choices=["api", "admission", "worker", *SERVE_HANDLERS])

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
    logging.basicConfig(level=os.environ.get("LEDGERLM_LOG_LEVEL", "WARNING"))
    if argv[:1] == ["model"] or argv[:2] == ["serve", "worker"]:
        os.execv(sys.executable, [sys.executable, "-m", "workers", *argv])
    parser = build_parser()
    handlers = dict(HANDLERS)
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    for name in FEATURE_MODULES:
        handlers.update(importlib.import_module(name).register(verbs))
    args = parser.parse_args(argv)
    settings = Settings()
    if args.verb == "serve":
        try:
            tune_process(settings, args.process)
        except ValueError as exc:  # CPUs this process may not use: say so, start nothing
            parser.error(f"LEDGERLM_CPUS: {exc}")
        serve = {"api": _serve_api, "admission": _serve_admission, **SERVE_HANDLERS}
        return serve[args.process](settings, args)
    return handlers[args.verb](settings, args)


