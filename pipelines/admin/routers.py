"""Admin commands of router aliases (`models.router`): set an alias's rules and fallbacks,
or clear them. One admin event each, so every API routes by the same table and a replay
knows which rules were in force when."""
from __future__ import annotations

from pydantic import ValidationError

from models.events import Envelope
from models.events_admin import RouteRule, RouterCleared, RouterSet
from pipelines.admin.commands import PLATFORM, AdminError, AdminNotFound, RegistryView, _admin_event, _append


def _pinnable(registry, revision: str, where: str) -> None:
    if registry.pinnable(revision) is None:
        raise AdminNotFound(f"{where}: model revision {revision!r} is not approved, or is retired")


def set_router(view: RegistryView, *, alias: str, rules: list[dict], fallbacks: list[str], actor: str) -> Envelope:
    registry = view.refresh()
    if alias not in registry.aliases:
        raise AdminNotFound(f"model alias {alias!r} does not exist")
    try:
        parsed = [RouteRule(**rule) for rule in rules]
    except (ValidationError, TypeError) as exc:
        raise AdminError(f"rules: {exc}") from None
    names = [r.name for r in parsed]
    if len(set(names)) != len(names):
        raise AdminError("rules: each rule needs a name of its own")
    for rule in parsed:
        if (rule.revision is None) == (rule.task is None):
            raise AdminError(f"rule {rule.name!r}: name either a revision (static) or a task (dynamic)")
        if rule.task is not None and not rule.revisions:
            raise AdminError(f"rule {rule.name!r}: a dynamic rule chooses among its revisions: name some")
        for revision in ([rule.revision] if rule.revision else list(rule.revisions)):
            _pinnable(registry, revision, f"rule {rule.name!r}")
    for revision in fallbacks:
        _pinnable(registry, revision, "fallbacks")
    env = _admin_event(RouterSet(alias=alias, rules=tuple(parsed), fallbacks=tuple(fallbacks), actor=actor), PLATFORM)
    _append(view._log, env)
    return env


def clear_router(view: RegistryView, *, alias: str, actor: str) -> Envelope:
    if alias not in view.refresh().routers:
        raise AdminNotFound(f"model alias {alias!r} has no router")
    env = _admin_event(RouterCleared(alias=alias, actor=actor), PLATFORM)
    _append(view._log, env)
    return env


def describe(registry, alias: str) -> dict:
    router = registry.routers.get(alias)
    if router is None:
        raise AdminNotFound(f"model alias {alias!r} has no router")
    return {"alias": alias, "default_revision": registry.aliases[alias].model_revision if alias in registry.aliases
            else None, "rules": [r.model_dump() for r in router.rules], "fallbacks": list(router.fallbacks)}
