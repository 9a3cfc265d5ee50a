"""The parts of an interactive worker's process (`ledgerlm serve worker`, wired in
`api.worker_process`): which revision it serves, its engine checked and warmed, its threads
placed beside the engine's, and the worker built on it as the settings configure it."""
from __future__ import annotations

import os
from pathlib import Path

from models.digests import TenantDigests
from models.settings import Settings
from pipelines.bootstrap import Bootstrap
from pipelines.process_tuning import run_on_cpus


def model_dir(settings: Settings) -> Path:
    """The configured model, or the tiny generated one under the platform's home; a
    configured path that is no model directory is an `ArtifactError` saying so in a line."""
    if settings.model is not None:
        return check_model_dir(settings.model, loads_config=settings.engine_factory.startswith("workers.vllm_engine:"))
    from workers.tiny_model import make_tiny_model

    return make_tiny_model(settings.ensure_home() / "models" / "tiny")


def check_model_dir(path: Path, *, loads_config: bool = True) -> Path:
    """`path` if it is a model directory as the engine loads one (with `loads_config`, as
    vLLM does, a Hugging Face directory: its config.json); otherwise an `ArtifactError`
    naming it and what is wrong. Another engine's directory only has to be one."""
    from pipelines.artifacts import ArtifactError

    if not path.exists():
        raise ArtifactError(f"LEDGERLM_MODEL={path}: no such directory")
    if not path.is_dir():
        raise ArtifactError(f"LEDGERLM_MODEL={path}: not a directory (give the model's directory)")
    if loads_config and not (path / "config.json").is_file():
        raise ArtifactError(f"LEDGERLM_MODEL={path}: no config.json in it, so it is no model directory "
                            f"(ledgerlm model prepare-small makes one)")
    return path


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


def resolve_worker_revision(settings: Settings, *, revision: str | None = None, alias: str | None = None):
    """(the settings that load the revision, the revision) for a worker; the clear errors of
    `workers.revision` when it is not approved or its engine would hash differently."""
    from models.engine_settings import detect_device, resolve
    from workers.revision import check_artifacts, check_engine, engine_settings, revision_to_serve

    platform = Bootstrap(settings)
    with platform.event_log() as log:
        registry = platform.registry_view(log).refresh()
    path = None
    config_hash = None
    if revision is None and alias is None:
        path = model_dir(settings).resolve()
        # the port's hash (no engine starts), with the device's default engine settings, as `model approve` has it
        defaults = settings.engine_settings or resolve({}, detect_device())
        config_hash = platform.engine(model=path, engine_settings=defaults).engine_config_hash()
    serving = revision_to_serve(registry, revision=revision, alias=alias, model_path=path,
                                config_hash=config_hash)
    settings = engine_settings(settings, serving)
    check_engine(Bootstrap(settings).engine(), serving)  # before minutes of engine start
    check_artifacts(settings, serving)  # the files it would load are the approved ones
    return settings, serving


def ready_engine(settings: Settings, runner, serving) -> tuple[str, set[int] | None, set[int]]:
    """Checks the loaded engine against the revision, warms it and places this process's
    threads beside it: (its config hash, the CPUs this process runs on, None where it was
    left alone, the CPUs its engine is pinned to, empty unless `engine_pinned`)."""
    from workers.revision import check_engine, warm_up

    config_hash = check_engine(runner.engine, serving)  # from the engine it actually loaded
    runner.submit(warm_up(runner.engine), timeout=300)  # warm before it joins the fleet
    cpus = place_beside_engine(settings, runner.engine)
    engine_cpus = runner.engine.pin_to_compute_cpus() if settings.engine_pinned else set()
    return config_hash, cpus, engine_cpus


def new_worker(settings: Settings, log, runner, *, revision: str, config_hash: str, cancel_log,
               pool: str | None = None, worker_id: str | None = None, engine=None):
    """An `InteractiveWorker` on `runner`'s engine (or `engine`, which runs on its loop) as
    the settings configure it."""
    from workers.interactive import InteractiveWorker

    return InteractiveWorker(log, runner, engine or runner.engine, max_in_flight=settings.engine_max_seqs, pool=pool,
                             take_ahead=settings.worker_take_ahead, worker_id=worker_id, cancel_log=cancel_log,
                             stream_linger_s=settings.stream_linger_ms / 1000, revision=revision,
                             engine_config_hash=config_hash, digests=TenantDigests.from_settings(settings),
                             kv_overcommit=settings.kv_overcommit)
