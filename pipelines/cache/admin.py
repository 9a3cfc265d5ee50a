"""Admin commands of the semantic cache: a tenant's policy for an alias, and invalidation.
Both are admin events (`CachePolicySet`, `CacheInvalidated`), so every API applies them
from the log, and a replay knows which policy and entries were in force when."""
from __future__ import annotations

from models.events import Envelope
from models.events_admin import CacheInvalidated, CachePolicySet
from models.registry import Registry
from pipelines.admin.commands import AdminError, AdminForbidden, AdminNotFound, RegistryView, _admin_event, _append
from pipelines.cache.semantic import PLATFORM_FLOOR


def check(registry: Registry, tenant_id: str, alias: str | None) -> None:
    if tenant_id not in registry.tenants:
        raise AdminNotFound(f"tenant {tenant_id!r} does not exist")
    if alias is not None and (alias not in registry.aliases or not registry.aliases[alias].allows(tenant_id)):
        raise AdminNotFound(f"the model alias {alias!r} does not exist for tenant {tenant_id!r}")


def set_policy(view: RegistryView, *, tenant_id: str, alias: str, actor: str, enabled: bool, operator: bool,
               threshold: float | None = None, ttl_s: int | None = None, sampled_too: bool | None = None,
               price_output_per_1k_micros: int | None = None, floor: float = PLATFORM_FLOOR) -> Envelope:
    """Turns a tenant's cache for an alias on or off, keeping what is not given. A tenant
    admin may do so for its own tenant (its routes check that) but not set the price,
    which only an operator may (`operator`)."""
    registry = view.refresh()
    check(registry, tenant_id, alias)
    if threshold is not None and threshold < floor:
        raise AdminError(f"threshold {threshold} is below the platform's floor of {floor}: a tenant may raise the "
                         f"similarity a hit needs, not lower it")
    if price_output_per_1k_micros is not None and not operator:
        raise AdminForbidden("only an operator sets the cache's price")
    now = registry.cache_policy(tenant_id, alias)
    payload = CachePolicySet(
        tenant_id=tenant_id, model_alias=alias, enabled=enabled,
        threshold=threshold if threshold is not None else now.threshold,
        ttl_s=ttl_s if ttl_s is not None else now.ttl_s,
        sampled_too=sampled_too if sampled_too is not None else now.sampled_too,
        price_output_per_1k_micros=(price_output_per_1k_micros if price_output_per_1k_micros is not None
                                    else now.price_output_per_1k_micros),
        actor=actor)
    env = _admin_event(payload, tenant_id)
    _append(view._log, env)
    return env


def invalidate(view: RegistryView, *, tenant_id: str, actor: str, alias: str | None = None,
               reason: str | None = None) -> Envelope:
    """Every answer cached so far for the tenant and alias (all its aliases, with None) is
    dead from this event on, in every API."""
    check(view.refresh(), tenant_id, alias)
    env = _admin_event(CacheInvalidated(tenant_id=tenant_id, model_alias=alias, actor=actor, reason=reason),
                       tenant_id)
    _append(view._log, env)
    return env


def policies(registry: Registry, tenant_id: str) -> list[dict]:
    """The tenant's policies, by alias, with the invalidations so far."""
    return [{"tenant_id": tenant, "model_alias": alias, "enabled": p.enabled, "threshold": p.threshold,
             "ttl_s": p.ttl_s, "sampled_too": p.sampled_too,
             "price_output_per_1k_micros": p.price_output_per_1k_micros,
             "invalidations": registry.cache_epoch(tenant, alias)}
            for (tenant, alias), p in sorted(registry.cache_policies.items()) if tenant == tenant_id]
