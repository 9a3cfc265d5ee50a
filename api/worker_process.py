"""`ledgerlm serve worker` (and `python -m workers serve worker`): an interactive pool worker
as `api.cli.processes` runs it. It resolves the revision it serves (`--revision`, `--alias`, or
the configured model's), starts, checks and warms its engine, places its own threads beside
the engine's, builds the worker and, with `--admit`, runs admission on a thread beside it,
handing what can start at once straight to the worker."""
from __future__ import annotations

import logging
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

from api.process_kit import Launch, Refused, Started, admission_processor
from models.settings import Settings, format_cpu_list

EXIT_ADMISSION_FAILED = 70  # EX_SOFTWARE: admission stopped (said on stderr), for the supervisor to restart it


def worker_flags(parser) -> None:
    parser.add_argument("--pool", help="serve only this dedicated pool (default: the shared interactive pool)")
    serving = parser.add_mutually_exclusive_group()
    serving.add_argument("--revision", help="serve this approved model revision (default: the approved revision "
                                            "of the configured model, LEDGERLM_MODEL)")
    serving.add_argument("--alias", help="serve the revision this alias pins now")
    parser.add_argument("--admit", action="store_true",
                        help="also run admission, taking work it can start at once in the same commit "
                             "(the same as LEDGERLM_WORKER_ADMITS=1)")


@dataclass
class Served:
    """The engine a worker serves with: its runner, the revision and the engine's config
    hash, and where this process's threads (None: left alone) and the engine's run."""

    runner: object
    revision: str
    config_hash: str
    cpus: set[int] | None = None
    engine_cpus: set[int] = field(default_factory=set)


@contextmanager
def _refusals():
    """A revision that is not approved, an engine that hashes otherwise, files that are not
    the approved ones: said plainly, exit status 2."""
    from pipelines.artifacts import ArtifactError
    from workers.engine import EngineMismatch
    from workers.revision import UnknownRevision

    try:
        yield
    except (UnknownRevision, EngineMismatch, ArtifactError) as exc:
        raise Refused(f"ledgerlm serve worker: {exc}") from exc


def start_worker(launch: Launch, *, runner=None, revision: str | None = None, worker_id: str | None = None,
                 engine=None) -> Started:
    """Starts the worker and what it holds on `launch.held`. A test hands in a started
    `runner` and the `revision` it serves (then nothing is resolved, checked, warmed or
    placed), and may name the worker and wrap its engine (`engine`, on the runner's loop)."""
    from pipelines.process_tuning import lower_session_priority
    from workers.serving import new_worker, resolve_worker_revision

    settings, args = launch.settings, launch.args
    if args.admit:
        settings = settings.model_copy(update={"worker_admits": True})
    if runner is None:
        with _refusals():
            settings, serving = resolve_worker_revision(settings, revision=args.revision, alias=args.alias)
        lower_session_priority(settings.engine_nice)
    log = launch.log()
    if runner is None:
        served = _start_engine(launch, settings, serving)
    else:
        served = Served(runner, revision, runner.engine.engine_config_hash())
    worker = launch.hold(new_worker(settings, log, served.runner, revision=served.revision,
                                    config_hash=served.config_hash, cancel_log=launch.log(create_topics=False),
                                    pool=args.pool, worker_id=worker_id, engine=engine))
    return _serving(launch, settings, worker, served)


def _start_engine(launch: Launch, settings: Settings, serving) -> Served:
    from pipelines.bootstrap import Bootstrap
    from workers.engine_runner import EngineRunner
    from workers.serving import ready_engine

    runner = launch.hold(EngineRunner(Bootstrap(settings).engine()).start())
    with _refusals():
        config_hash, cpus, engine_cpus = ready_engine(settings, runner, serving)
    return Served(runner, serving.model_revision, config_hash, cpus, engine_cpus)


def _serving(launch: Launch, settings: Settings, worker, served: Served) -> Started:
    """Admission beside the worker (with `worker_admits`), the worker joined to the fleet,
    and what the run loop serves, prints and runs."""
    from pipelines.admission.metrics import AdmissionMetrics
    from pipelines.outage import Readiness
    from workers.metrics import worker_metrics

    readiness = Readiness("worker")
    beside, registries, failed = [], [worker_metrics(worker)], []
    parts = {}
    if settings.worker_admits:
        metrics = AdmissionMetrics.from_settings(settings)
        beside.append(Readiness("admission"))
        registries.append(metrics.registry)
        parts["admission"], failed = _admit_beside(launch, settings, worker, metrics, beside[0])
    worker.join()

    def ready_line(port: int | None) -> dict:
        return {"worker": worker.worker_id, "ready": not worker.engine_dead, "admits": settings.worker_admits,
                "metrics_port": port, "revision": served.revision,
                "cpus": format_cpu_list(served.cpus) if served.cpus else None,
                "engine_cpus": format_cpu_list(served.engine_cpus) if served.engine_cpus else None}
    # /readyz: its engine lives (engine_watch marks it dead) and its log answers.
    return Started(worker, lambda stop: worker.run(stop, readiness), readiness=(readiness, *beside),
                   registries=tuple(registries), ready=lambda: {"engine": not worker.engine_dead, "log": readiness.serving},
                   ready_line=ready_line, exit_code=lambda: _exit_code(worker, failed), parts=parts)


def _admit_beside(launch: Launch, settings: Settings, worker, metrics, readiness):
    """Admission on a thread of this process, on its own log handle, handing what can start
    at once straight to `worker`: (the processor, the errors it stopped on). A log that
    fails is waited out (`readiness` down meanwhile); any other failure sets the stop event:
    the process goes down with it, for its supervisor to restart."""
    from models import topics

    log = launch.log(create_topics=False)
    processor = launch.hold(admission_processor(settings, log, taker=worker,
                                                member_id=topics.admission_member(worker.worker_id),
                                                on_written=metrics.written))
    metrics.follow(processor)
    failed: list[BaseException] = []

    def admit() -> None:
        try:
            processor.run(launch.stop, readiness)
        except BaseException as exc:
            logging.getLogger(__name__).exception("admission stopped")
            print(f"ledgerlm serve worker: admission stopped on an error it cannot ride out: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            failed.append(exc)
            launch.stop.set()
            raise
    thread = threading.Thread(target=admit, name="admission", daemon=True)
    thread.start()
    launch.held.callback(thread.join, 30)
    return processor, failed


def _exit_code(worker, admission_failed: list) -> int:
    if worker.engine_dead:  # non-zero, for its supervisor to restart it on a fresh engine
        print(f"ledgerlm serve worker: the engine died ({worker.engine_death}); exiting", file=sys.stderr)
    if admission_failed and not worker.exit_code:
        return EXIT_ADMISSION_FAILED
    return worker.exit_code
