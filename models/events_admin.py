"""Admin changes are events too: tenants, keys, limits, model revisions and aliases.

Key secrets never appear here: only their SHA-256 and a short public prefix.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from models.events import Payload, event

Scope = Literal["generate", "batch", "usage", "audit", "admin"]
ALL_SCOPES: tuple[Scope, ...] = ("generate", "batch", "usage", "audit", "admin")


@event("TenantCreated")
class TenantCreated(Payload):
    tenant_id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    name: str
    actor: str


@event("ApiKeyIssued")
class ApiKeyIssued(Payload):
    key_id: str
    tenant_id: str
    application_id: str = "default"
    secret_sha256: str
    scopes: tuple[Scope, ...]
    actor: str


@event("ApiKeyRevoked")
class ApiKeyRevoked(Payload):
    key_id: str
    tenant_id: str
    actor: str


@event("ModelRevisionApproved")
class ModelRevisionApproved(Payload):
    """A pinned revision: the model directory plus the engine config that shapes output."""

    model_revision: str
    model_path: str
    engine_config_hash: str
    max_model_len: int = Field(gt=0)
    price_input_per_1k_micros: int = Field(default=0, ge=0)
    price_output_per_1k_micros: int = Field(default=0, ge=0)
    actor: str


@event("ModelAliasSet")
class ModelAliasSet(Payload):
    """Points an alias at a revision, for every tenant (tenant_id '*') or for one."""

    alias: str
    model_revision: str
    allowed_tenants: tuple[str, ...] = ("*",)
    actor: str
