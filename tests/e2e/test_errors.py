"""Bad input and refusals, each with its status and an OpenAI-style error body, and none
of them reaching a worker: credentials (401/403), sizes (413), absurd values (400), and
admission's rejections (429 with Retry-After, 400/413 for limits), streamed or not."""
from __future__ import annotations

from models import topics
from pipelines.admin import commands as admin
from tests.e2e.test_cancel import tenant_events
from tests.harness import MODEL_ALIAS

OK = {"model_alias": MODEL_ALIAS, "input": "x", "max_output_tokens": 2, "stream": False}
CHAT = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}


def assert_error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"] and "param" in error and "code" in error
    if code is not None:
        assert error["code"] == code, error
    return error


def nothing_ran(platform, tenant_id: str) -> bool:
    return not [e for e in tenant_events(platform.admin_log, topics.OUTCOMES, tenant_id)]


def test_credentials(platform):
    tenant_id, secret = platform.tenant()
    _, batch_only = platform.tenant(scopes=("batch",))
    revoked_tenant, revoked = platform.tenant()
    registry = platform.view.refresh()
    key_id = next(p.key_id for h, p in registry.keys_by_hash.items() if p.tenant_id == revoked_tenant)
    admin.revoke_key(platform.view, key_id=key_id, actor="tests")
    for secret_, status in [("wrong", 401), (revoked, 401), (batch_only, 403)]:
        with platform.client(secret_) as client:
            for response in [client.post("/v1/generations", json=OK), client.post("/v1/chat/completions", json=CHAT),
                             client.post("/v1/completions", json={"model": MODEL_ALIAS, "prompt": "x"}),
                             client.get("/v1/generations/gen_x"), client.post("/v1/generations/gen_x/cancel"),
                             client.get("/v1/generations/gen_x/events")]:
                assert_error(response, status)
    with platform.client() as anonymous:
        assert_error(anonymous.post("/v1/chat/completions", json=CHAT), 401)
    assert nothing_ran(platform, revoked_tenant)


def test_bad_input(platform):
    tenant_id, secret = platform.tenant()
    long_input = "word " * 2000  # well past the tiny model's 512-token context
    with platform.client(secret) as client:
        assert_error(client.post("/v1/generations", json={**OK, "input": long_input}), 413, "context_length_exceeded")
        assert_error(client.post("/v1/chat/completions", json={
            **CHAT, "messages": [{"role": "user", "content": long_input}]}), 413)
        assert_error(client.post("/v1/generations", json={**OK, "input": "y" * 1_000_001}), 413)
        assert_error(client.post("/v1/completions", content=b"{" + b" " * (9 * 1024 * 1024) + b"}",
                                 headers={"content-type": "application/json"}), 413)
        for absurd in (0, -3, 10_000, 10**12):
            assert_error(client.post("/v1/generations", json={**OK, "max_output_tokens": absurd}), 400)
            assert_error(client.post("/v1/chat/completions", json={**CHAT, "max_tokens": absurd}), 400)
        assert_error(client.post("/v1/generations", json={**OK, "deadline_ms": -1}), 400)
        assert_error(client.post("/v1/chat/completions", json={**CHAT, "deadline_ms": 0}), 400)
        assert_error(client.post("/v1/chat/completions", json={**CHAT, "messages": []}), 400)
        assert_error(client.post("/v1/chat/completions", json={**CHAT, "n": 3}), 400)
        assert_error(client.post("/v1/completions", json={"model": MODEL_ALIAS, "prompt": ["a", "b"]}), 400)
        assert_error(client.post("/v1/chat/completions", content=b"{oops", headers={"content-type": "application/json"}),
                     400, "invalid_json")
        assert_error(client.post("/v1/chat/completions", json={**CHAT, "model": "nope"}), 404, "model_not_found")
    assert nothing_ran(platform, tenant_id)


def test_admission_rejections_become_429_with_retry_after_or_limit_errors(platform):
    tenant_id, secret = platform.tenant()
    admin.set_limits(platform.view, tenant_id=tenant_id, actor="tests", max_input_tokens=3, max_output_tokens=4)
    with platform.client(secret) as client:
        assert_error(client.post("/v1/generations", json={**OK, "input": "many words in this input"}), 413,
                     "input_too_large")
        assert_error(client.post("/v1/generations", json={**OK, "max_output_tokens": 5}), 400, "output_too_large")
    assert nothing_ran(platform, tenant_id)

    limited, secret = platform.tenant()
    admin.set_limits(platform.view, tenant_id=limited, actor="tests", requests_per_minute=1)
    with platform.client(secret) as client:
        assert client.post("/v1/generations", json=OK).status_code == 200
        for response in [client.post("/v1/generations", json=OK), client.post("/v1/chat/completions", json=CHAT)]:
            assert_error(response, 429, "rate")
            assert int(response.headers["retry-after"]) >= 1
        # Streamed requests wait for admission before any header: a real 429, not a 200 stream.
        for path, body in [("/v1/generations", {**OK, "stream": True}), ("/v1/chat/completions", {**CHAT, "stream": True})]:
            with client.stream("POST", path, json=body) as response:
                response.read()
                assert_error(response, 429, "rate")
                assert response.headers["content-type"].startswith("application/json")
    started = [e for e in tenant_events(platform.admin_log, topics.OUTCOMES, limited) if e.event_type == "GenerationStarted"]
    assert len(started) == 1, "only the admitted request reached a worker"
