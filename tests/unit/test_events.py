"""The event envelope: stable bytes, golden samples, versioning errors."""
from __future__ import annotations

import json

import pytest

from models.events import (
    MalformedEvent, UnknownEventType, UnsupportedSchemaVersion, decode, encode, new_event, registered_types,
    _UPCASTERS,
)
from models.events_generation import CancelRequested, TokensEmitted
from tests.golden.samples import HERE, sample_path


def golden_files():
    return sorted(HERE.glob("*.json"))


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: p.stem)
def test_golden_sample_decodes_and_reencodes_to_the_same_bytes(path):
    raw = path.read_bytes().rstrip(b"\n")
    assert encode(decode(raw)) == raw


def test_every_registered_event_type_has_a_golden_sample():
    missing = [name for name, cls in registered_types().items()
               if not sample_path(name, cls.schema_version).exists()]
    assert not missing, f"run `python -m tests.golden.samples` and commit the samples for {missing}"


def test_round_trip_keeps_every_field():
    env = new_event(TokensEmitted(request_id="r", seq=3, text="héllo", token_count=2), tenant_id="t",
                    correlation_id="r", causation_id="c")
    back = decode(encode(env))
    assert back == env
    assert back.payload.text == "héllo"


def test_encoding_is_canonical_sorted_compact_utf8():
    raw = encode(new_event(CancelRequested(request_id="r"), tenant_id="t", correlation_id="r"))
    data = json.loads(raw)
    assert raw == json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _raw(**overrides):
    data = json.loads(encode(new_event(CancelRequested(request_id="r"), tenant_id="t", correlation_id="r")))
    data.update(overrides)
    return json.dumps(data).encode()


def test_unknown_event_type_is_a_clear_error():
    with pytest.raises(UnknownEventType, match="NoSuchEvent"):
        decode(_raw(event_type="NoSuchEvent"))


def test_newer_schema_version_is_refused():
    with pytest.raises(UnsupportedSchemaVersion, match="newer"):
        decode(_raw(schema_version=2))


@pytest.mark.parametrize("raw", [b"not json", b"[1,2]", b'{"event_type": "CancelRequested"}'])
def test_malformed_bytes_are_refused(raw):
    with pytest.raises(MalformedEvent):
        decode(raw)


def test_payload_of_the_wrong_type_is_refused():
    with pytest.raises(MalformedEvent, match="CancelRequested"):
        decode(_raw(payload={"request_id": 5, "reason": "nope"}))


def test_older_versions_are_upcast_step_by_step(monkeypatch):
    # Pretend CancelRequested is at v3 and v1 lacked `reason`, v2 called it `why`.
    monkeypatch.setattr(CancelRequested, "schema_version", 3)
    monkeypatch.setitem(_UPCASTERS, ("CancelRequested", 1), lambda p: {**p, "why": "client"})
    monkeypatch.setitem(_UPCASTERS, ("CancelRequested", 2), lambda p: {"request_id": p["request_id"], "reason": p["why"]})
    old = json.loads(_raw())
    old["schema_version"] = 1
    old["payload"] = {"request_id": "r"}
    env = decode(json.dumps(old).encode())
    assert env.schema_version == 3
    assert env.payload.reason == "client"
