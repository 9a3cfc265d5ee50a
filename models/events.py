"""The event envelope and its stable JSON form: making, encoding and decoding events.

Every state change in ledgerlm is one of these. Payload classes are registered with
their event type and current schema version; older versions are upcast step by step on
read, newer or unknown ones are refused with a clear error.
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer

from models.event_types import (  # noqa: F401 - the registry's names, read here and imported from here
    EventDecodeError, MalformedEvent, Payload, UnknownEventType, UnsupportedSchemaVersion, _TYPES, _UPCASTERS, event,
    payload_type, registered_types, upcaster,
)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Envelope(BaseModel):
    model_config = ConfigDict(frozen=True)

    event_id: uuid.UUID
    event_type: str
    schema_version: int
    occurred_at: datetime
    tenant_id: str
    correlation_id: str
    causation_id: str | None = None
    payload: Payload

    @field_serializer("occurred_at")
    def _utc_iso(self, value: datetime) -> str:
        return value.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")

    @field_serializer("payload")
    def _payload(self, value: Payload) -> dict[str, Any]:
        return value.model_dump(mode="json")


def new_event(
    payload: Payload,
    *,
    tenant_id: str,
    correlation_id: str,
    causation_id: str | None = None,
    occurred_at: datetime | None = None,
    event_id: uuid.UUID | None = None,
) -> Envelope:
    return Envelope(
        event_id=event_id or uuid.uuid4(),
        event_type=payload.event_type,
        schema_version=payload.schema_version,
        occurred_at=occurred_at or utcnow(),
        tenant_id=tenant_id,
        correlation_id=correlation_id,
        causation_id=causation_id,
        payload=payload,
    )


def caused_by(cause: Envelope, payload: Payload, **overrides: Any) -> Envelope:
    """A follow-up event in the same conversation as `cause`."""
    fields = dict(tenant_id=cause.tenant_id, correlation_id=cause.correlation_id, causation_id=str(cause.event_id))
    fields.update(overrides)
    return new_event(payload, **fields)


def canonical(data: Any) -> bytes:
    """The one byte form used on the log and for hashing: sorted keys, no spaces, UTF-8."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def encode(env: Envelope) -> bytes:
    return canonical(env.model_dump(mode="json"))


def decode(raw: bytes) -> Envelope:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedEvent(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise MalformedEvent("event is not a JSON object")
    name, version = data.get("event_type"), data.get("schema_version")
    if not isinstance(name, str) or not isinstance(version, int) or isinstance(version, bool):
        raise MalformedEvent("event_type and schema_version are required")
    cls = payload_type(name)
    if version > cls.schema_version:
        raise UnsupportedSchemaVersion(
            f"{name} schema_version {version} is newer than this build knows ({cls.schema_version})"
        )
    if version < 1:
        raise UnsupportedSchemaVersion(f"{name} schema_version {version} is not valid")
    payload = data.get("payload")
    if not isinstance(payload, dict):
        raise MalformedEvent(f"{name} payload is not an object")
    for step in range(version, cls.schema_version):
        try:
            payload = _UPCASTERS[(name, step)](dict(payload))
        except KeyError:
            raise UnsupportedSchemaVersion(f"no upcaster for {name} v{step}") from None
    try:
        return Envelope(
            event_id=data.get("event_id"),
            event_type=name,
            schema_version=cls.schema_version,
            occurred_at=data.get("occurred_at"),
            tenant_id=data.get("tenant_id"),
            correlation_id=data.get("correlation_id"),
            causation_id=data.get("causation_id"),
            payload=cls.model_validate(payload),
        )
    except ValidationError as exc:
        raise MalformedEvent(f"{name}: {exc.errors(include_url=False)}") from None


NonNegInt = Field(ge=0)


# Registers the event catalogue; kept last so those modules can import from this one.
from models import events_generation, events_admin, events_batch, events_fleet, events_rollout  # noqa: E402,F401
from models import events_idempotency  # noqa: E402,F401
