"""Ending a generation early: cancelled by its client, or because its client went away.
Either way the worker aborts it, it ends cancelled, and its reservation settles once.

The tiny model writes a long answer in well under a second, so a cancel sent when the
stream starts could lose the race to the last token. These tests give the tenant a pool
of its own whose worker runs the shared engine through `HeldEngine`: a generation's last
delta waits until the request is aborted, so every cancel meets its generation running
(aborted mid-stream by vLLM, or while its end is held) and the outcome is certain.

The platform runs in this process, so the tests learn endings from the API (the events
stream) and read only the tenant's own partitions: scanning whole topics while waiting
would starve the very threads whose timing is being tested.
"""
from __future__ import annotations

import json
import socket
import uuid

import pytest

from models import topics
from models.events import decode
from pipelines.admin import commands as admin
from pipelines.eventlog import partition_for
from tests.e2e.test_streaming import sse_frames
from tests.engine_wrappers import HeldEngine
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until

LONG = {"model_alias": MODEL_ALIAS, "input": "tell me a long story", "max_output_tokens": 480, "ignore_eos": True}


@pytest.fixture
def held(platform):
    """A tenant whose work runs on a worker of its own over `HeldEngine`:
    (tenant_id, secret, the engine)."""
    tenant_id, secret = platform.tenant()
    pool = "held-" + uuid.uuid4().hex[:8]
    admin.set_limits(platform.view, tenant_id=tenant_id, actor="tests", pool=pool)
    engine = HeldEngine(platform.runner.engine)
    loop = platform.start_worker(pool=pool, max_in_flight=2, engine=engine)
    yield tenant_id, secret, engine
    loop.halt()
    platform.check()


@pytest.fixture
def short_grace(platform, monkeypatch):
    """The API waits a grace before cancelling for a client that went away: a short one here."""
    monkeypatch.setattr(platform.app.state.services.reaper, "grace_s", 0.02)


def tenant_events(log, topic, tenant_id: str) -> list:
    records = log.read_partition(topic.name, partition_for(tenant_id, log.partitions(topic.name)))
    return [env for env in (decode(r.value) for r in records) if env.tenant_id == tenant_id]


def events_of(log, tenant_id: str, request_id: str, topic, event_type: str) -> list:
    return [e for e in tenant_events(log, topic, tenant_id)
            if e.correlation_id == request_id and e.event_type == event_type]


def settlement(platform, tenant_id: str, request_id: str):
    [settled] = wait_until(lambda: events_of(platform.admin_log, tenant_id, request_id, topics.LEDGER,
                                             "UsageSettled"), 30, every_s=0.2, what="the settlement")
    return settled.payload


def final_event(client, request_id: str) -> dict:
    """How the generation ended, as its (replayed) stream says: waits without polling."""
    with client.stream("GET", f"/v1/generations/{request_id}/events") as response:
        frames = [data for _, data in sse_frames(response)]
    assert frames[-1] == "[DONE]"
    return frames[-2]


def cancel_right_after_start(platform, secret: str) -> tuple[str, dict, dict]:
    """One long generation, cancelled as soon as its stream says it started: (id, the
    cancel's answer, the stream's last event)."""
    with platform.client(secret) as client, client.stream("POST", "/v1/generations", json=LONG) as response:
        assert response.status_code == 200
        frames = sse_frames(response)
        _, started = next(frames)
        assert started["type"] == "started"
        with platform.client(secret) as other:
            cancel = other.post(f"/v1/generations/{started['request_id']}/cancel")
        assert cancel.status_code == 200, cancel.text
        rest = [data for _, data in frames]
    assert rest[-1] == "[DONE]"
    return started["request_id"], cancel.json(), rest[-2]


def test_cancel_mid_stream_ends_the_generation_cancelled(platform, held):
    tenant_id, secret, engine = held
    request_id, answer, final = cancel_right_after_start(platform, secret)
    assert answer["status"] in ("cancelling", "cancelled")
    assert final["type"] == "cancelled" and final["reason"] == "client", final
    # Cut short: the held end (or what vLLM had not made yet) never went out.
    assert final["usage"]["output_tokens"] < LONG["max_output_tokens"]
    settled = settlement(platform, tenant_id, request_id)
    assert settled.terminal_status == "cancelled"
    assert settled.output_tokens == final["usage"]["output_tokens"]
    assert request_id not in engine.held or request_id in engine.released
    with platform.client(secret) as client:
        status = client.get(f"/v1/generations/{request_id}").json()
        assert status["status"] == "cancelled" and status["error_code"] == "client"
        again = client.post(f"/v1/generations/{request_id}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled", "cancelling twice changes nothing"


def test_cancelling_a_generation_that_ended_changes_nothing(platform):
    tenant_id, secret = platform.tenant()
    with platform.client(secret) as client:
        done = client.post("/v1/generations", json={**LONG, "max_output_tokens": 8, "stream": False})
        assert done.status_code == 200, done.text
        request_id = done.json()["request_id"]
        assert done.json()["type"] == "completed"
        answer = client.post(f"/v1/generations/{request_id}/cancel")
        assert answer.status_code == 200 and answer.json()["status"] == "completed", answer.text
        assert client.get(f"/v1/generations/{request_id}").json()["status"] == "completed"
    settled = settlement(platform, tenant_id, request_id)
    assert settled.terminal_status == "completed" and settled.output_tokens == 8


def disconnect_right_after_start(platform, tenant_id: str, secret: str) -> tuple[str, dict]:
    with platform.client(secret) as client:
        with client.stream("POST", "/v1/generations", json=LONG) as response:
            frames = sse_frames(response)
            _, started = next(frames)
            assert started["type"] == "started"
            request_id = started["request_id"]
        # The connection is closed here, mid-stream. (Reading its stream again before the
        # cancel is asked for would count as the client coming back, and keep it running.)
        [cancel] = wait_until(lambda: events_of(platform.admin_log, tenant_id, request_id, topics.REQUESTS,
                                                "CancelRequested"), 30, every_s=0.2, what="the cancel")
        assert cancel.payload.reason == "client_gone"
        return request_id, final_event(client, request_id)


def test_streaming_client_that_disconnects_gets_its_generation_cancelled(platform, held, short_grace):
    tenant_id, secret, _ = held
    request_id, final = disconnect_right_after_start(platform, tenant_id, secret)
    assert final["type"] == "cancelled" and final["reason"] == "client_gone", final
    assert final["usage"]["output_tokens"] < LONG["max_output_tokens"]
    settled = settlement(platform, tenant_id, request_id)
    assert settled.terminal_status == "cancelled"
    assert settled.output_tokens == final["usage"]["output_tokens"]


def test_non_streaming_client_that_gives_up_gets_its_generation_cancelled(platform, held, short_grace):
    tenant_id, secret, _ = held
    body = json.dumps({**LONG, "stream": False}).encode()
    with socket.create_connection(("127.0.0.1", platform.port)) as sock:
        sock.sendall(b"POST /v1/generations HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + secret.encode() + b"\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    # Gone at once, with no response read: whether its work had started or was still queued,
    # the API asks for the cancel and the request ends cancelled.
    [requested] = wait_until(lambda: [e for e in tenant_events(platform.admin_log, topics.REQUESTS, tenant_id)
                                      if e.event_type == "GenerationRequested"], 30, every_s=0.2,
                             what="the request")
    request_id = requested.payload.request_id
    [cancel] = wait_until(lambda: events_of(platform.admin_log, tenant_id, request_id, topics.REQUESTS,
                                            "CancelRequested"), 30, every_s=0.2, what="the cancel")
    assert cancel.payload.reason == "client_gone"
    with platform.client(secret) as client:
        final = final_event(client, request_id)
    assert final["type"] == "cancelled" and final["reason"] == "client_gone", final
    assert settlement(platform, tenant_id, request_id).terminal_status == "cancelled"
