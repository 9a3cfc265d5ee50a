"""Every kind of frame of ledgerlm's own stream echoes the request_id a client chose, and
keeps the generation's id as `id` (the end frames are hard to reach on purpose end to end:
`tests/integration/test_request_id_echo.py` covers the stream itself)."""
from __future__ import annotations

import json

from api.sse import event_json, native_frames_for
from api.stream_hub import StreamEvent
from models.events import new_event
from models.events_generation import (
    GenerationCancelled, GenerationFailed, GenerationRejected, GenerationStarted, TokensEmitted,
)

GEN = "gen_" + "0" * 32
PAYLOADS = (
    GenerationStarted(request_id=GEN, worker_id="w1", model_revision="tiny@r1", queued_ms=3),
    TokensEmitted(request_id=GEN, seq=0, text="hi", token_count=1),
    GenerationCancelled(request_id=GEN, reason="client", input_tokens=2, output_tokens=1),
    GenerationFailed(request_id=GEN, error_code="engine_dead", message="gone", input_tokens=2),
    GenerationRejected(request_id=GEN, reason="rate", message="slow down", retry_after_ms=100),
)


def stream_event(payload, offset: int = 7) -> StreamEvent:
    return StreamEvent(offset, new_event(payload, tenant_id="t1", correlation_id=GEN))


def test_each_frame_kind_echoes_the_chosen_request_id_and_keeps_the_generation_id():
    kinds = []
    for payload in PAYLOADS:
        body = event_json(stream_event(payload), "long-1")
        assert (body["id"], body["request_id"]) == (GEN, "long-1"), body
        kinds.append(body["type"])
    assert kinds == ["started", "tokens", "cancelled", "failed", "rejected"]


def test_with_no_chosen_request_id_request_id_stays_the_generation_id():
    for payload in PAYLOADS:
        body = event_json(stream_event(payload))
        assert body["id"] == body["request_id"] == GEN


def test_a_rendered_frame_carries_the_echo_and_its_offset_as_sse_id():
    [raw] = native_frames_for("long-1")(stream_event(PAYLOADS[2], offset=41))
    head, data = raw.decode().split("\n", 1)
    assert head == "id: 41" and raw.endswith(b"\n\n")
    body = json.loads(data.removeprefix("data: "))
    assert (body["type"], body["request_id"], body["id"]) == ("cancelled", "long-1", GEN)
