"""Who acts on a `/v1/admin` route, and on which tenants (the rules: `models.authz`).

Two dependencies: `OperatorDep` for platform routes (every tenant, models, fleet), and
`TenantAdminDep` for routes a tenant admin may use on its own tenant. A route of the
second kind asks `actor.tenant(...)`, which answers any other tenant as missing (404):
to a tenant admin, another tenant does not exist.
"""
from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from api.deps import ServicesDep, current_principal
from api.errors import ApiError
from models.authz import is_operator, is_tenant_admin


@dataclass(frozen=True)
class Actor:
    name: str  # as the admin events record it: "bootstrap", or "tenant/key_id"
    tenant_id: str | None  # None: an operator, over every tenant

    @property
    def operator(self) -> bool:
        return self.tenant_id is None

    def may_manage(self, tenant_id: str) -> bool:
        return self.operator or tenant_id == self.tenant_id

    def tenant(self, tenant_id: str) -> str:
        if not self.may_manage(tenant_id):
            raise ApiError(404, f"tenant {tenant_id!r} does not exist", code="not_found")
        return tenant_id

    def __str__(self) -> str:
        return self.name


def _actor(request: Request, svc, *, tenant_admin: bool) -> Actor:
    token = svc.settings.bootstrap_token
    scheme, _, secret = request.headers.get("authorization", "").partition(" ")
    if token and scheme.lower() == "bearer" and hmac.compare_digest(secret.strip().encode(), token.encode()):
        return Actor("bootstrap", None)
    principal = current_principal(request, svc)
    name = f"{principal.tenant_id}/{principal.key_id}"
    if is_operator(principal.scopes):
        return Actor(name, None)
    if tenant_admin and is_tenant_admin(principal.scopes):
        return Actor(name, principal.tenant_id)
    wanted = "'operator' or 'tenant_admin'" if tenant_admin else "'operator'"
    raise ApiError(403, f"This key lacks the {wanted} scope", code="insufficient_scope")


def operator_actor(request: Request, svc: ServicesDep) -> Actor:
    """An operator: a key with the `operator` (or older `admin`) scope, or the bootstrap token."""
    return _actor(request, svc, tenant_admin=False)


def tenant_admin_actor(request: Request, svc: ServicesDep) -> Actor:
    """An operator, or a tenant admin (limited to its own tenant by `Actor.tenant`)."""
    return _actor(request, svc, tenant_admin=True)


OperatorDep = Annotated[Actor, Depends(operator_actor)]
TenantAdminDep = Annotated[Actor, Depends(tenant_admin_actor)]
