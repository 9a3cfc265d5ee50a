"""`ledgerlm serve projector`: every projection kept up to date from the log, the audit trail
sealed on time and once more at shutdown; and the parts the `ledgerlm projections`, `audit`
and `replay` verbs share with it (the runner, the signer, the refusal of the development key)."""
from __future__ import annotations

from api.process_kit import Launch, Refused, Started
from models.settings import Settings


def audit_signer(settings: Settings):
    from pipelines.signing import signer_from_key

    return signer_from_key(settings.audit_signing_key)


def projection_runner(settings: Settings, log, *, batch_events: int = 5000, migrate: bool = True):
    """(a `ProjectionRunner` of every projection on `log`, the projection database's engine)."""
    from migrations.runner import upgrade
    from pipelines.bootstrap import Bootstrap
    from pipelines.projections import all_projections
    from pipelines.projections.runner import ProjectionRunner

    if migrate:  # the projector brings its schema to head, so a quick start needs no extra step
        upgrade(settings.database_url)
    engine = Bootstrap(settings).projection_db()
    return ProjectionRunner(log, engine, all_projections(audit_signer(settings)), batch_events=batch_events), engine


def dev_key_refusal(settings: Settings) -> str | None:
    """What is said when the settings would sign the trail with the development key where
    that is refused; None when they may go on."""
    from pipelines.signing import dev_key_refused

    why = dev_key_refused(settings)
    return f"ledgerlm: {why}" if why else None


def start_projector(launch: Launch) -> Started:
    from pipelines.audit.seal import Sealer
    from pipelines.metrics import projector_metrics
    from pipelines.outage import Readiness

    settings = launch.settings
    if refusal := dev_key_refusal(settings):
        raise Refused(refusal)
    readiness = Readiness("projector", stall_s=None)  # a long catch-up is work, not a stall
    runner, engine = projection_runner(settings, launch.log())
    launch.held.callback(engine.dispose)
    sealer = Sealer(engine, audit_signer(settings), settings.audit_seal_every_s).start()
    launch.held.callback(sealer.stop)  # seals the heads once more: the trail ends signed
    # Transient log and database errors are waited out inside `run`.
    return Started(runner, lambda stop: runner.run(stop, readiness=readiness), readiness=(readiness,),
                   registries=(projector_metrics(runner),),
                   ready_line=lambda port: {"projector": "ready", "metrics_port": port})
