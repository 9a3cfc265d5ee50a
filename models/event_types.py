"""Event payload types and their registry: the base class every payload extends, `@event`
to register one with its type and schema version, and `@upcaster` for reading an older
version. `models.events` (the envelope, encoding and decoding) reads the registry; the
payload modules (`models.events_generation` and the others) only register into it."""
from __future__ import annotations

from typing import Any, Callable, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict


class EventDecodeError(ValueError):
    """Bytes on the log that cannot become an event."""


class UnknownEventType(EventDecodeError):
    pass


class UnsupportedSchemaVersion(EventDecodeError):
    pass


class MalformedEvent(EventDecodeError):
    pass


class Payload(BaseModel):
    """Base of every event payload. Subclasses are registered with `@event`."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    event_type: ClassVar[str]
    schema_version: ClassVar[int]


P = TypeVar("P", bound=Payload)
_TYPES: dict[str, type[Payload]] = {}
_UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}


def event(name: str, version: int = 1) -> Callable[[type[P]], type[P]]:
    def register(cls: type[P]) -> type[P]:
        if name in _TYPES:
            raise RuntimeError(f"event type {name} registered twice")
        cls.event_type = name
        cls.schema_version = version
        _TYPES[name] = cls
        return cls

    return register


def upcaster(name: str, from_version: int):
    """Registers a function turning a payload dict of `from_version` into `from_version + 1`."""

    def register(fn: Callable[[dict[str, Any]], dict[str, Any]]):
        _UPCASTERS[(name, from_version)] = fn
        return fn

    return register


def payload_type(name: str) -> type[Payload]:
    try:
        return _TYPES[name]
    except KeyError:
        raise UnknownEventType(f"unknown event_type {name!r}") from None


def registered_types() -> dict[str, type[Payload]]:
    return dict(_TYPES)
