"""The platform's processes, declared once: what each is, its flags, and how it is started
(`PROCESSES`); and the one loop that runs every one of them (`run`, and `serve` for
`ledgerlm serve NAME` in the main thread: tuning, signals, what is said on stderr, the exit
status). `ledgerlm serve NAME`, `python -m workers serve worker` (which hands over to it),
`ledgerlm demo`, infra/compose.yaml, the README's quickstart and the tests' platform all
start these.

The loop: SIGINT and SIGTERM set a stop event; the process starts (what it opens is closed
when it ends, the last opened first); its metrics and `ledgerlm_ready` gauge are served on
`LEDGERLM_METRICS_PORT` (none by default; `/healthz`, `/readyz` beside them); it prints its
ready line, a JSON object, once it serves; it runs until the stop event is set; it closes.
Exit status: 0 after a stop, 2 when it refuses to start (said plainly on stderr), 70
(EX_SOFTWARE) on an error it cannot ride out (said on stderr; a worker's is raised, so 1
with its traceback), and a worker's own otherwise (75 once its engine died)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable

from api.process_kit import Launch, Refused, Started, admission_processor
from api.projector import start_projector
from api.worker_process import start_worker, worker_flags
from models.settings import Settings
from pipelines.log_level import log_level
from pipelines.process_tuning import tune_process


@dataclass(frozen=True)
class Process:
    """One of the platform's processes. `start(launch, **given)` starts it (a test hands in
    what it shares, e.g. a worker's running engine); a process that is another program
    (`exec_argv`) replaces this one instead. `ready_says`: what its ready line holds once it
    serves (None: it prints none; the API answers `/healthz`)."""

    name: str
    does: str
    start: Callable[..., Started] | None = None
    exec_argv: Callable[[Settings, argparse.Namespace], list[str]] | None = None
    flags: Callable[[argparse.ArgumentParser], None] | None = None
    ready_says: str | None = None
    metrics: bool = True  # serves `LEDGERLM_METRICS_PORT` (the API serves its own `/metrics`)
    fatal_exit: int | None = 70  # None: the error is raised after it is said
    demo: bool = False  # on the interactive path, which `ledgerlm demo` starts

    def argv(self, *flags: str) -> list[str]:
        """The command line that starts it with this interpreter."""
        return [sys.executable, "-m", "api.cli", "serve", self.name, *flags]


def _start_api(launch: Launch) -> Started:
    import uvicorn

    from api.app import build_services, create_app

    settings = launch.settings
    app = create_app(build_services(settings))
    server = uvicorn.Server(uvicorn.Config(app, host=settings.api_host, port=settings.api_port,
                                          log_level=log_level().lower()))

    def run(stop: threading.Event) -> None:
        # uvicorn answers the signals itself while it serves, then hands them on to the loop's.
        threading.Thread(target=lambda: stop.wait() or setattr(server, "should_exit", True), name="api-stop",
                         daemon=True).start()
        threading.Thread(target=_say_where, args=(server, settings.api_host, stop), name="api-ready",
                         daemon=True).start()
        server.run()
        if not server.started:
            raise SystemExit(3)  # uvicorn's status when it could not start (e.g. the port is taken)
    return Started(app, run)


def _say_where(server, host: str, stop: threading.Event) -> None:
    """Prints where the API listens once uvicorn has bound its socket (its ready line)."""
    while not (server.started or server.should_exit or stop.is_set()):
        stop.wait(0.05)
    if server.started:
        port = next((s.getsockname()[1] for srv in server.servers for s in srv.sockets), None)
        print(json.dumps({"api": "ready", "url": f"http://{host}:{port}"}), flush=True)


def _start_admission(launch: Launch, *, taker=None) -> Started:
    from pipelines.admission.metrics import AdmissionMetrics
    from pipelines.outage import Readiness

    metrics = AdmissionMetrics.from_settings(launch.settings)
    readiness = Readiness("admission")
    processor = launch.hold(admission_processor(launch.settings, launch.log(), taker=taker, on_written=metrics.written))
    metrics.follow(processor)
    # Transient log errors are waited out inside `run`.
    return Started(processor, lambda stop: processor.run(stop, readiness), readiness=(readiness,),
                   registries=(metrics.registry,))


def _start_rollouts(launch: Launch) -> Started:
    from pipelines.bootstrap import Bootstrap
    from pipelines.cache.similarity import Embedder, model_dir
    from pipelines.outage import Readiness, keep_running
    from pipelines.rollouts.controller import RolloutController

    log = launch.log()
    controller = launch.hold(RolloutController(log, Bootstrap(launch.settings).registry_view(log),
                                               embedder=Embedder(model_dir(launch.settings.home))))
    readiness = Readiness("rollouts")
    return Started(controller, lambda stop: keep_running(lambda: controller.run_once(0.2), stop, readiness=readiness),
                   readiness=(readiness,), ready_line=lambda _: {"rollouts": "ready"})


def _start_batch_dispatcher(launch: Launch) -> Started:
    from pipelines.batch.dispatcher import dispatcher_from_settings
    from pipelines.bootstrap import Bootstrap
    from pipelines.metrics import dispatcher_metrics
    from pipelines.outage import Readiness

    log = launch.log()
    dispatcher = launch.hold(dispatcher_from_settings(launch.settings, log, Bootstrap(launch.settings)))
    readiness = Readiness("batch-dispatcher")
    return Started(dispatcher, lambda stop: dispatcher.run(stop, readiness), readiness=(readiness,),
                   registries=(dispatcher_metrics(dispatcher),),
                   ready_line=lambda port: {"batch_dispatcher": "ready", "metrics_port": port})


def _batch_worker_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", type=_pool_name,
                        help="run only this dedicated pool's chunks (default: the shared batch pool)")


def _pool_name(value: str) -> str:
    import re

    from models.limits import POOL_PATTERN

    if not re.match(POOL_PATTERN, value):
        raise argparse.ArgumentTypeError(f"not a pool name: {value!r} (lower-case letters, digits, '-', '_')")
    return value


def _batch_worker_argv(settings: Settings, args: argparse.Namespace | None = None) -> list[str]:
    """One Celery worker process with one warm engine; its child serves the chunks' metrics.
    With `--pool NAME` it takes only that pool's queue (and is named after it)."""
    from pipelines.batch.queue import pool_queue

    pool = getattr(args, "pool", None)
    queue = pool_queue(settings.batch_queue, pool)
    named = ["-n", f"{queue}@%h"] if pool else []
    return [sys.executable, "-m", "celery", "-A", "workers.batch.celery_app", "worker", "-Q", queue, *named,
            "-c", "1", "--pool", "prefork", "-l", os.environ.get("LEDGERLM_LOG_LEVEL", "INFO"),
            "--include", "workers.batch_metrics"]


# In the order the README's quickstart starts them.
PROCESSES: dict[str, Process] = {p.name: p for p in [
    Process("worker", "interactive pool worker on vLLM", start_worker, flags=worker_flags, ready_says='"ready": true',
            fatal_exit=None, demo=True),
    Process("admission", "decides and reserves each tenant's budget", _start_admission, demo=True),
    Process("api", "HTTP on LEDGERLM_API_HOST:LEDGERLM_API_PORT", _start_api, metrics=False, demo=True),
    Process("projector", "usage, quotas, audit trail, job status", start_projector,
            ready_says='"projector": "ready"'),
    Process("batch-dispatcher", "validates, splits and finishes batches", _start_batch_dispatcher,
            ready_says='"batch_dispatcher": "ready"'),
    Process("batch-worker", "runs batch chunks (Celery, one warm engine)", exec_argv=_batch_worker_argv,
            flags=_batch_worker_flags, ready_says="ready."),
    Process("rollouts", "rollout guardrails: steps, promotes and rolls back", _start_rollouts,
            ready_says='"rollouts": "ready"'),
]}


def add_serve_parser(verbs) -> None:
    """`ledgerlm serve NAME [flags]`, one sub-command per process."""
    serve = verbs.add_parser("serve", help="run one of the platform's processes")
    names = serve.add_subparsers(dest="process", required=True, metavar="PROCESS")
    for process in PROCESSES.values():
        parser = names.add_parser(process.name, help=process.does)
        if process.flags is not None:
            process.flags(parser)


def arguments(name: str, *flags: str) -> argparse.Namespace:
    """The parsed flags of `ledgerlm serve NAME FLAGS...` (for a process started in a test)."""
    parser = argparse.ArgumentParser(prog="ledgerlm")
    add_serve_parser(parser.add_subparsers(dest="verb"))
    return parser.parse_args(["serve", name, *flags])


def run(process: Process, settings: Settings, args: argparse.Namespace, stop: threading.Event, *,
        open_log=None, given: dict | None = None, started: Callable[[Started], None] | None = None,
        fatal: Callable[[Exception], int] | None = None) -> int:
    """Runs `process` until `stop` is set (in any thread): starts it, serves its metrics,
    prints its ready line, calls `started` with what started, runs it, closes it; returns
    its exit status. An error from its run goes to `fatal` (which says what it exits with),
    or is raised; one while it starts is raised (`Refused` where it refuses plainly)."""
    with ExitStack() as held:
        try:
            running = process.start(Launch(settings, args, stop, held, open_log), **(given or {}))
            port = None
            if process.metrics:
                port = _serve_metrics(settings, running, held)
            if running.ready_line is not None:
                print(json.dumps(running.ready_line(port)), flush=True)
            if started is not None:
                started(running)
            try:
                running.run(stop)
            except Exception as exc:
                if fatal is None:
                    raise
                return fatal(exc)
        finally:
            stop.set()  # what runs beside it stops before anything closes
    return running.exit_code()


def _serve_metrics(settings: Settings, running: Started, held: ExitStack) -> int | None:
    from pipelines.metrics import serve_metrics
    from pipelines.outage import readiness_registry

    server = serve_metrics(settings, *running.registries, readiness_registry(*running.readiness), ready=running.ready)
    if server is None:
        return None
    held.callback(server.close)
    return server.port


def stop_on_signal() -> threading.Event:
    """An event SIGINT and SIGTERM set (this thread must be the main one)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def serve(settings: Settings, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`ledgerlm serve NAME`: tunes this process for it (CPUs it may not use are refused
    through `parser`, before anything starts), then runs it until SIGINT or SIGTERM."""
    process = PROCESSES[args.process]
    try:
        tune_process(settings, process.name)
    except ValueError as exc:
        parser.error(f"LEDGERLM_CPUS: {exc}")
    if process.exec_argv is not None:
        argv = process.exec_argv(settings, args)
        if getattr(args, "pool", None):
            os.environ["LEDGERLM_BATCH_POOL"] = args.pool  # the worker names itself after its pool
        os.execv(argv[0], argv)

    def fatal(exc: Exception) -> int:
        from pipelines.outage import exit_on_fatal

        code = exit_on_fatal(process.name, exc, process.fatal_exit or 70)
        if process.fatal_exit is None:
            raise exc
        return code
    try:
        return run(process, settings, args, stop_on_signal(), fatal=fatal)
    except Refused as exc:
        print(exc, file=sys.stderr)
        return exc.code
