"""Golden JSON samples of every event type, one file each under tests/golden/events/.

A sample is written once (`python -m tests.golden.samples`) and then only read: a schema
change that can no longer decode an old sample, or encodes it differently, fails
tests/unit/test_events.py. New event types get a sample built from their field types.
Fields added later to a version, with defaults, get a sample of their own beside the first
(`<type>.v<n>.<what>.json`, written from the current shape), so both shapes keep decoding
to the same bytes.
"""
from __future__ import annotations

import typing
import uuid
from datetime import datetime, timezone
from pathlib import Path
from types import NoneType, UnionType

from pydantic import BaseModel

from models.events import Envelope, Payload, encode, registered_types

HERE = Path(__file__).parent / "events"
WHEN = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)


def _example(annotation, name: str):
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return typing.get_args(annotation)[0]
    if origin in (typing.Union, UnionType):
        options = [a for a in typing.get_args(annotation) if a is not NoneType]
        return _example(options[0], name)
    if origin is tuple:
        return (_example(typing.get_args(annotation)[0], name),)
    if origin is dict:
        return {}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return example_payload(annotation)
    return {str: f"{name}-1", int: 1, float: 0.5, bool: False, datetime: WHEN}.get(annotation, f"{name}-1")


def example_payload(cls: type[BaseModel]) -> BaseModel:
    values = {}
    for name, field in cls.model_fields.items():
        values[name] = _example(field.annotation, name)
    return cls.model_validate(values)


def sample(cls: type[Payload]) -> bytes:
    env = Envelope(event_id=uuid.UUID(int=1), event_type=cls.event_type, schema_version=cls.schema_version,
                   occurred_at=WHEN, tenant_id="tenant-a", correlation_id="corr-1", causation_id=None,
                   payload=example_payload(cls))
    return encode(env)


def sample_path(event_type: str, version: int) -> Path:
    return HERE / f"{event_type}.v{version}.json"


def write_missing() -> list[Path]:
    HERE.mkdir(parents=True, exist_ok=True)
    written = []
    for name, cls in sorted(registered_types().items()):
        path = sample_path(name, cls.schema_version)
        if not path.exists():
            path.write_bytes(sample(cls) + b"\n")
            written.append(path)
    return written


if __name__ == "__main__":
    for path in write_missing():
        print("wrote", path)
