"""A streaming client that goes away early: its tenant is charged for what the engine
generated (during the reconnect grace too), and the usage shows what was delivered
beside it. The grace is a setting (`disconnect_grace_s`).

Where the engine's pace decides what a test sees, the request goes to a revision of its
own on an engine of known speed (`tests.fleet_pool`, `tests.slow_engine`); a completed
generation runs on the platform's vLLM engine."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from models.settings import Settings
from tests.e2e.test_cancel import settlement
from tests.e2e.test_streaming import sse_frames
from tests.fleet_pool import pool_of
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until

LONG = {"model_alias": MODEL_ALIAS, "input": "tell a long story", "max_output_tokens": 400, "ignore_eos": True}


@contextmanager
def paced(platform, secret: str, pause_s: float) -> Iterator[str]:
    """A revision of its own, served by one worker (one slot) on an engine of one token
    every `pause_s`, once the fleet shows it; yields its alias."""
    with pool_of(platform, workers=1, pause_s=pause_s, max_in_flight=1, name="delivered") as pool, \
            platform.client(secret) as client:
        wait_until(lambda: client.get(f"/v1/models/{pool.alias}").json()["serving"]["workers"] >= 1, 30,
                   what=f"the fleet to show the worker of {pool.revision}")
        yield pool.alias


def leave_after(client, body: dict, tokens: int) -> str:
    """Streams a generation and goes away once `tokens` output tokens were read; its id."""
    with client.stream("POST", "/v1/generations", json=body) as response:
        assert response.status_code == 200
        read = 0
        for _, data in sse_frames(response):
            read += data.get("token_count", 0)
            if read >= tokens:
                return data["request_id"]
    raise AssertionError(f"the stream ended before {tokens} tokens were read")


def test_the_reconnect_grace_is_a_setting():
    assert Settings().disconnect_grace_s == 2.0
    assert Settings(disconnect_grace_s=0.5).disconnect_grace_s == 0.5


def test_a_client_that_drops_after_a_few_tokens_is_charged_what_was_generated_and_shown_both(platform, monkeypatch):
    monkeypatch.setattr(platform.app.state.services.reaper, "grace_s", 1.0)
    tenant_id, secret = platform.tenant()
    # One token every 20 ms, so the engine makes dozens more during the grace.
    try:
        with paced(platform, secret, 0.02) as alias, platform.client(secret) as client:
            request_id = leave_after(client, {**LONG, "model_alias": alias}, 3)
            # Gone after 3 tokens; the generation runs on through the grace, then is cancelled.
            settled = settlement(platform, tenant_id, request_id)
            assert settled.terminal_status == "cancelled"
            delivered = settled.delivered_output_tokens
            assert delivered is not None and 3 <= delivered < settled.output_tokens < LONG["max_output_tokens"], (
                delivered, settled.output_tokens)
            assert settled.cost_micros > 0
            status = wait_until(lambda: (s := client.get(f"/v1/generations/{request_id}").json())["usage"]["settled"]
                                and s, 30, every_s=0.2, what="the settled status")
            assert status["usage"]["output_tokens"] == settled.output_tokens
            assert status["usage"]["delivered_output_tokens"] == delivered
    finally:
        platform.check()


def test_a_client_that_drops_and_whose_generation_ends_inside_the_grace_is_shown_what_it_read(platform,
                                                                                                monkeypatch):
    """Nothing is cancelled (the generation ended first), but the usage must not show the
    whole output as delivered: it shows what the stream had sent when the client left."""
    monkeypatch.setattr(platform.app.state.services.reaper, "grace_s", 5.0)
    tenant_id, secret = platform.tenant()
    # 60 tokens, one every 10 ms: the rest is generated well inside the 5 s grace.
    try:
        with paced(platform, secret, 0.01) as alias, platform.client(secret) as client:
            request_id = leave_after(client, {**LONG, "model_alias": alias, "max_output_tokens": 60}, 3)
            settled = settlement(platform, tenant_id, request_id)
            assert (settled.terminal_status, settled.output_tokens) == ("completed", 60), settled
            status = wait_until(lambda: (s := client.get(f"/v1/generations/{request_id}").json())["usage"]["settled"]
                                and s["usage"]["delivered_output_tokens"] < 60 and s, 30, every_s=0.2,
                                what="a delivered count below the 60 generated")
            assert 3 <= status["usage"]["delivered_output_tokens"] < 60, status["usage"]
            assert status["usage"]["output_tokens"] == 60 and status["status"] == "completed"
    finally:
        platform.check()


def test_a_completed_generation_delivered_all_it_generated(platform):
    tenant_id, secret = platform.tenant()
    with platform.client(secret) as client:
        done = client.post("/v1/generations", json={**LONG, "max_output_tokens": 5, "stream": False})
        assert done.status_code == 200, done.text
        request_id = done.json()["request_id"]
        settled = settlement(platform, tenant_id, request_id)
        assert settled.delivered_output_tokens is None and settled.output_tokens == 5
        status = client.get(f"/v1/generations/{request_id}").json()
        assert status["usage"]["delivered_output_tokens"] == status["usage"]["output_tokens"] == 5
