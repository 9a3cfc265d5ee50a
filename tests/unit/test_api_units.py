"""Pure parts of the HTTP surface: idempotency decisions and ids, the error mapping of
admission rejections, Last-Event-ID parsing, and the OpenAI shapes of a stream."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from api.errors import ApiError, rejection_error
from api.openai_format import OpenAIShape
from api.routes.streams import parse_last_event_id
from api.stream_hub import StreamEvent
from models.events import new_event
from models.events_generation import (
    GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationRejected, GenerationStarted, Timings,
    TokensEmitted,
)
from pipelines.generation import idempotency
from pipelines.generation.idempotency import Claim, Decision, decide

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


def test_idempotency_decisions():
    claim = Claim("gen_1", "body-a", NOW - timedelta(hours=1), offset=7)
    assert decide(None, "body-a", NOW) is Decision.NEW
    assert decide(claim, "body-a", NOW) is Decision.REPLAY
    assert decide(claim, "body-b", NOW) is Decision.CONFLICT
    stale = Claim("gen_1", "body-a", NOW - timedelta(hours=25), offset=7)
    assert decide(stale, "body-b", NOW) is Decision.NEW, "a key is free again after 24 h"


def test_ids_and_hashes_are_per_tenant_and_body():
    assert idempotency.key_sha256("a", "k") != idempotency.key_sha256("b", "k")
    assert idempotency.request_sha256("r", {"x": 1, "y": 2}) == idempotency.request_sha256("r", {"y": 2, "x": 1})
    assert idempotency.request_sha256("r", {"x": 1}) != idempotency.request_sha256("other", {"x": 1})
    one = idempotency.keyed_request_id("gen_", "a", "k", NOW)
    assert one == idempotency.keyed_request_id("gen_", "a", "k", NOW + timedelta(hours=1))
    assert one != idempotency.keyed_request_id("gen_", "b", "k", NOW)
    assert one != idempotency.keyed_request_id("gen_", "a", "k", NOW + timedelta(days=1))
    assert idempotency.client_request_id("a", "order-1") != idempotency.client_request_id("b", "order-1")


@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "tab\t", "é"])
def test_malformed_idempotency_keys_are_refused(key):
    with pytest.raises(idempotency.IdempotencyKeyInvalid):
        idempotency.validate_key(key)


@pytest.mark.parametrize("reason,retry_ms,status,retry_after", [
    ("rate", 1500, 429, "2"), ("concurrency", None, 400, None), ("tokens", 60_000, 429, "60"), ("spend", 1, 429, "1"),
    ("tokens", 3_601_000, 429, "3601"), ("tokens", None, 400, None),
    ("input_too_large", None, 413, None), ("output_too_large", None, 400, None),
    ("deadline", 2500, 429, "3"), ("deadline", None, 400, None),
])
def test_rejections_map_to_statuses(reason, retry_ms, status, retry_after):
    error = rejection_error(GenerationRejected(request_id="r", reason=reason, message="m", retry_after_ms=retry_ms))
    assert isinstance(error, ApiError) and error.status == status and error.code == reason
    assert (error.headers or {}).get("Retry-After") == retry_after


def test_last_event_id_parsing():
    assert parse_last_event_id(None) is None
    assert parse_last_event_id("0") == 0 and parse_last_event_id(" 42 ") == 42
    for bad in ("", "-1", "1e3", "abc", "1" * 19):
        with pytest.raises(ApiError) as raised:
            parse_last_event_id(bad)
        assert raised.value.status == 400


def ev(offset: int, payload) -> StreamEvent:
    return StreamEvent(offset, new_event(payload, tenant_id="t", correlation_id="r"))


STREAM = [
    ev(3, GenerationStarted(request_id="r", worker_id="w", model_revision="tiny@1", queued_ms=2)),
    ev(5, TokensEmitted(request_id="r", seq=0, text="Hel", token_count=1)),
    ev(6, TokensEmitted(request_id="r", seq=1, text="lo", token_count=1)),
    ev(9, GenerationCompleted(request_id="r", finish_reason="length", input_tokens=4, output_tokens=2,
                              model_revision="tiny@1", output_sha256="x", timings=Timings())),
]


def frames(chunks: list[bytes]) -> list[dict]:
    return [json.loads(c.decode().split("data: ", 1)[1]) for c in chunks]


def test_openai_chat_chunks_with_usage():
    shape = OpenAIShape("chat", "chatcmpl-1", "tiny", 123, include_usage=True)
    out = frames([c for e in STREAM for c in shape.chunks(e)])
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [o["choices"][0]["delta"].get("content") for o in out[1:3]] == ["Hel", "lo"]
    assert out[3]["choices"][0]["finish_reason"] == "length" and out[3]["usage"] is None
    assert out[4]["choices"] == [] and out[4]["usage"] == {"prompt_tokens": 4, "completion_tokens": 2,
                                                           "total_tokens": 6}
    assert {o["object"] for o in out} == {"chat.completion.chunk"} and {o["id"] for o in out} == {"chatcmpl-1"}
    assert out[-1]["system_fingerprint"] == "tiny@1"


def test_openai_text_completion_response_and_errors():
    shape = OpenAIShape("text", "cmpl-1", "tiny", 123)
    out = frames([c for e in STREAM for c in shape.chunks(e)])
    assert [o["choices"][0]["text"] for o in out] == ["Hel", "lo", ""] and "usage" not in out[0]
    whole = shape.response("Hello", STREAM[-1].env.payload)
    assert whole["object"] == "text_completion" and whole["choices"][0]["text"] == "Hello"
    assert whole["usage"]["total_tokens"] == 6
    cancelled = GenerationCancelled(request_id="r", reason="client", input_tokens=4, output_tokens=1)
    assert shape.response("H", cancelled)["choices"][0]["finish_reason"] == "cancelled"
    failed = frames(shape.chunks(ev(10, GenerationFailed(request_id="r", error_code="engine_error", message="boom"))))
    assert failed == [{"error": {"message": "The generation failed", "type": "server_error", "param": None,
                                 "code": "engine_error"}}]
