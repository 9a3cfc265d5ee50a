"""Ending a generation early: cancelled by its client, or because its client went away.
Either way the worker aborts it, it ends cancelled, and its reservation settles once."""
from __future__ import annotations

import json
import socket

import pytest

from models import topics
from models.events import decode
from pipelines.eventlog import partition_for
from tests.e2e.test_streaming import request_events, sse_frames
from tests.harness import MODEL_ALIAS, wait_until

LONG = {"model_alias": MODEL_ALIAS, "input": "tell me a long story", "max_output_tokens": 480, "ignore_eos": True}


@pytest.fixture
def short_grace(platform, monkeypatch):
    """The tiny model writes a long answer in about a second: a grace shorter than that."""
    monkeypatch.setattr(platform.app.state.services.reaper, "grace_s", 0.1)


def events_of(log, request_id: str, topic, event_type: str) -> list:
    return [env for _, env in request_events(log, request_id, topic) if env.event_type == event_type]


def settlement(platform, request_id: str):
    [settled] = wait_until(lambda: events_of(platform.admin_log, request_id, topics.LEDGER, "UsageSettled"), 30,
                           what="the settlement")
    return settled.payload


def test_cancel_mid_stream_ends_the_generation_cancelled(platform):
    _, secret = platform.tenant()
    with platform.client(secret) as client, client.stream("POST", "/v1/generations", json=LONG) as response:
        assert response.status_code == 200
        frames = sse_frames(response)
        _, started = next(frames)
        assert started["type"] == "started"
        request_id = started["request_id"]
        _, tokens = next(frames)
        assert tokens["type"] == "tokens"
        with platform.client(secret) as other:
            cancel = other.post(f"/v1/generations/{request_id}/cancel")
        assert cancel.status_code == 200, cancel.text
        assert cancel.json()["status"] == "cancelling"
        rest = [data for _, data in frames]
    assert rest[-1] == "[DONE]"
    final = rest[-2]
    assert final["type"] == "cancelled" and final["reason"] == "client"
    assert final["usage"]["output_tokens"] < LONG["max_output_tokens"]

    settled = settlement(platform, request_id)
    assert settled.terminal_status == "cancelled"
    assert settled.output_tokens == final["usage"]["output_tokens"]
    with platform.client(secret) as client:
        status = client.get(f"/v1/generations/{request_id}").json()
        assert status["status"] == "cancelled" and status["error_code"] == "client"
        again = client.post(f"/v1/generations/{request_id}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled", "cancelling twice changes nothing"


def test_streaming_client_that_disconnects_gets_its_generation_cancelled(platform, short_grace):
    _, secret = platform.tenant()
    with platform.client(secret) as client, client.stream("POST", "/v1/generations", json=LONG) as response:
        frames = sse_frames(response)
        request_id = next(frames)[1]["request_id"]
        assert next(frames)[1]["type"] == "tokens"
    # The connection is closed here, mid-stream.
    [cancel] = wait_until(lambda: events_of(platform.admin_log, request_id, topics.REQUESTS, "CancelRequested"),
                          30, what="the API to request the cancel")
    assert cancel.payload.reason == "client_gone"
    [ended] = wait_until(lambda: events_of(platform.admin_log, request_id, topics.OUTCOMES, "GenerationCancelled"),
                         30, what="the worker to abort")
    assert ended.payload.reason == "client_gone"
    assert ended.payload.output_tokens < LONG["max_output_tokens"]
    assert settlement(platform, request_id).terminal_status == "cancelled"


def test_non_streaming_client_that_gives_up_gets_its_generation_cancelled(platform, short_grace):
    tenant_id, secret = platform.tenant()
    body = json.dumps({**LONG, "stream": False}).encode()
    with socket.create_connection(("127.0.0.1", platform.port)) as sock:
        sock.sendall(b"POST /v1/generations HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + secret.encode() + b"\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        [started] = wait_until(lambda: [e for e in tenant_events(platform.admin_log, topics.OUTCOMES, tenant_id)
                                        if e.event_type == "GenerationStarted"], 30, what="the generation to start")
    # The client is gone, with no response read.
    request_id = started.payload.request_id
    [cancel] = wait_until(lambda: events_of(platform.admin_log, request_id, topics.REQUESTS, "CancelRequested"),
                          30, what="the API to request the cancel")
    assert cancel.payload.reason == "client_gone"
    assert settlement(platform, request_id).terminal_status == "cancelled"


def tenant_events(log, topic, tenant_id: str) -> list:
    partition, out, offset = partition_for(tenant_id, log.partitions(topic.name)), [], 0
    while batch := log.read(topic.name, partition, offset, max_records=1000):
        out += [env for env in (decode(r.value) for r in batch) if env.tenant_id == tenant_id]
        offset = batch[-1].offset + 1
    return out
