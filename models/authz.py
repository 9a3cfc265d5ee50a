"""Who may administer what: the platform operator and the tenant admin, as pure rules.

An operator (scope `operator`; the older `admin` scope means the same, so keys issued
before the split keep working) manages every tenant, the models, the fleet and rollouts,
and grants each tenant its limits. A tenant admin (scope `tenant_admin`) manages its own
tenant only: its keys (never with an operator scope) and its own limits, which can only
tighten what the operator granted. Any other tenant is, to a tenant admin, missing (404).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from models.limits import OWN_LIMIT_FIELDS
from models.quota import Limits

OPERATOR_SCOPES = frozenset({"operator", "admin"})
TENANT_ADMIN_SCOPE = "tenant_admin"
# What a tenant admin may put on the keys it issues: everything but an operator's scope.
TENANT_GRANTABLE_SCOPES = frozenset({"generate", "batch", "usage", "audit", TENANT_ADMIN_SCOPE})
# The limits a tenant admin may set for its own tenant (`OWN_LIMIT_FIELDS`) are the
# catalogue's ceilings marked `own`. Window length, pool, fair-share weight and the right
# to send `high` are the operator's alone.


def is_operator(scopes: Iterable[str]) -> bool:
    return not OPERATOR_SCOPES.isdisjoint(scopes)


def is_tenant_admin(scopes: Iterable[str]) -> bool:
    return TENANT_ADMIN_SCOPE in set(scopes)


def ungrantable_scopes(scopes: Iterable[str]) -> set[str]:
    """The scopes a tenant admin asked for that it may not issue."""
    return set(scopes) - TENANT_GRANTABLE_SCOPES


def beyond_grant(grant: Limits, own: dict) -> dict[str, tuple[int, int]]:
    """Own limits looser than the grant: field -> (asked, granted). None asks for no limit of
    its own, so the grant applies; it is never beyond it."""
    out = {}
    for name in OWN_LIMIT_FIELDS:
        asked, granted = own.get(name), getattr(grant, name)
        if asked is not None and granted is not None and asked > granted:
            out[name] = (asked, granted)
    return out


def tighten(grant: Limits, own: dict | None) -> Limits:
    """The limits in force: the operator's grant, tightened by the tenant's own. An own limit
    is never looser than the grant, even after the operator lowers it."""
    if not own:
        return grant
    values = {}
    for name in OWN_LIMIT_FIELDS:
        asked, granted = own.get(name), getattr(grant, name)
        values[name] = asked if granted is None else granted if asked is None else min(asked, granted)
    return replace(grant, **values)
