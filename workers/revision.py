"""Which revision an interactive worker serves, decided before its engine starts: the one
named (`--revision`), the one an alias pins (`--alias`), or the approved revision of the
configured model. The engine is then configured from that revision, and a worker whose
engine would hash differently refuses to start (`EngineMismatch`)."""
from __future__ import annotations

import uuid
from pathlib import Path

from models.registry import Registry, Revision
from models.settings import Settings
from workers.engine import EngineMismatch, EngineRequest, InferenceEngine


class UnknownRevision(LookupError):
    """The revision or alias a worker was started for is not approved."""


def revision_to_serve(registry: Registry, *, revision: str | None = None,
                      alias: str | None = None, model_path: Path | None = None,
                      config_hash: str | None = None) -> Revision:
    """The approved revision to serve. With neither `revision` nor `alias`: the revision
    approved for the configured model (`model_path` with the engine's `config_hash`). A
    retired revision is served by nobody new: no work can be pinned to it any more."""
    found = _revision_to_serve(registry, revision=revision, alias=alias, model_path=model_path,
                               config_hash=config_hash)
    if found.model_revision in registry.retired:
        raise UnknownRevision(f"model revision {found.model_revision!r} is retired; no new work can reach it")
    return found


def _revision_to_serve(registry: Registry, *, revision: str | None, alias: str | None, model_path: Path | None,
                       config_hash: str | None) -> Revision:
    if revision is not None:
        found = registry.revisions.get(revision)
        if found is None:
            raise UnknownRevision(f"model revision {revision!r} is not approved "
                                  f"(approved: {', '.join(sorted(registry.revisions)) or 'none'})")
        return found
    if alias is not None:
        entry = registry.aliases.get(alias)
        if entry is None or entry.model_revision not in registry.revisions:
            raise UnknownRevision(f"no approved revision behind the alias {alias!r} "
                                  f"(aliases: {', '.join(sorted(registry.aliases)) or 'none'})")
        return registry.revisions[entry.model_revision]
    for candidate in registry.revisions.values():
        if Path(candidate.model_path).resolve() == Path(model_path).resolve() and \
                candidate.engine_config_hash == config_hash:
            return candidate
    raise UnknownRevision(f"no approved revision is this worker's model ({model_path}) with its engine "
                          f"settings (config hash {config_hash}); approve it first: ledgerlm model approve")


def engine_settings(settings: Settings, revision: Revision) -> Settings:
    """The settings that load `revision`: its model directory, context length and engine settings."""
    return settings.model_copy(update={"model": Path(revision.model_path), "max_model_len": revision.max_model_len,
                                       "engine_settings": revision.engine_settings})


def check_artifacts(settings: Settings, revision: Revision) -> None:
    """`ArtifactError` unless the revision's directory holds the files it was approved with
    (a revision approved without digests is served unchecked, unless only signed ones are)."""
    from pipelines import artifacts

    artifacts.check_served(Path(revision.model_path), revision=revision.model_revision,
                           approved=revision.artifact_digests, signature=revision.artifact_signature,
                           verifiers=artifacts.trusted_verifiers(settings.artifact_trusted_keys),
                           require_signed=settings.require_signed_artifacts)


def check_engine(engine: InferenceEngine, revision: Revision) -> str:
    """The engine's config hash, when it is the revision's; `EngineMismatch` otherwise."""
    actual = engine.engine_config_hash()
    if actual != revision.engine_config_hash:
        raise EngineMismatch(f"this worker's engine config hashes to {actual}, but revision "
                             f"{revision.model_revision} was approved with {revision.engine_config_hash}: "
                             f"its outputs would not be that revision's (check LEDGERLM_MAX_MODEL_LEN and the "
                             f"engine settings, or approve this configuration as a revision of its own)")
    return actual


async def warm_up(engine: InferenceEngine, max_output_tokens: int = 4) -> int:
    """One short generation, so the first real request does not pay for the engine's first
    step (compilation, allocation); returns the tokens it made."""
    request = EngineRequest(request_id=f"warm-{uuid.uuid4().hex[:8]}", prompt="Hello", tenant_id="ledgerlm-warm-up",
                            max_output_tokens=max_output_tokens, temperature=0.0)
    made = 0
    async for delta in engine.generate(request):
        made = delta.output_tokens
        if delta.finished:
            break
    return made
