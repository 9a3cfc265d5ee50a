"""One generation all the way through: HTTP → log → admission → worker → vLLM → log → SSE,
on the embedded log and on Kafka."""
from __future__ import annotations

import json

from models import topics
from models.events import decode
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until
from tests.conftest import platform_both_ways

platform = platform_both_ways()  # each test also runs with admission in the worker


def sse_frames(response):
    """(id, data) pairs of an SSE response, data parsed as JSON except the final [DONE]."""
    event_id = None
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            data = line[6:]
            yield event_id, (data if data == "[DONE]" else json.loads(data))
            event_id = None


def request_events(log, request_id: str, topic) -> list:
    found = [(r, decode(r.value)) for r in log.read_topic(topic.name)]
    return [(r, env) for r, env in found if env.correlation_id == request_id]


def test_streaming_generation_end_to_end(platform):
    _, secret = platform.tenant()
    body = {"model_alias": MODEL_ALIAS, "input": "hello there", "max_output_tokens": 12, "ignore_eos": True}
    with platform.client(secret) as client, client.stream("POST", "/v1/generations", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        frames = list(sse_frames(response))
    platform.check()
    assert frames[-1] == (None, "[DONE]")
    events = [data for _, data in frames[:-1]]
    ids = [event_id for event_id, _ in frames[:-1]]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), "SSE ids are increasing log positions"
    assert events[0]["type"] == "started"
    tokens = [e for e in events if e["type"] == "tokens"]
    assert [t["seq"] for t in tokens] == list(range(len(tokens)))
    final = events[-1]
    assert final["type"] == "completed"
    assert final["finish_reason"] == "length"
    assert final["usage"]["output_tokens"] == 12 == sum(t["token_count"] for t in tokens)
    assert final["usage"]["input_tokens"] > 0
    assert final["model_revision"] == platform.model_revision

    # The log tells the same story, and the reservation settles exactly once.
    request_id = final["request_id"]
    log = platform.admin_log

    def settled():
        return [env for _, env in request_events(log, request_id, topics.LEDGER) if env.event_type == "UsageSettled"]

    [settlement] = wait_until(settled, 30, what="the settlement")
    assert settlement.payload.output_tokens == 12
    assert settlement.payload.terminal_status == "completed"
    ledger_types = [env.event_type for _, env in request_events(log, request_id, topics.LEDGER)]
    assert ledger_types == ["BudgetReserved", "GenerationAdmitted", "UsageSettled", "ReservationReleased"]
    durable_text = [env for t in topics.DURABLE for _, env in request_events(log, request_id, t)
                    if "hello there" in env.model_dump_json()]
    assert not durable_text, "prompt text must stay out of durable topics"


def test_non_streaming_generation_returns_text_and_usage(platform):
    _, secret = platform.tenant()
    body = {"model_alias": MODEL_ALIAS, "input": "count to three", "max_output_tokens": 5, "stream": False,
            "ignore_eos": True}
    with platform.client(secret) as client:
        response = client.post("/v1/generations", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["type"] == "completed"
    assert data["usage"]["output_tokens"] == 5
    assert isinstance(data["output"], str)


def test_bad_input_gets_openai_style_errors_and_reaches_no_worker(platform):
    _, secret = platform.tenant()
    served_before = platform.worker.served
    with platform.client(secret) as client:
        cases = [
            (client.post("/v1/generations", content=b"{not json", headers={"content-type": "application/json"}), 400),
            (client.post("/v1/generations", json={"model_alias": MODEL_ALIAS, "input": 5}), 400),
            (client.post("/v1/generations", json={"model_alias": MODEL_ALIAS, "input": "x", "max_output_tokens": 0}), 400),
            (client.post("/v1/generations", json={"model_alias": MODEL_ALIAS, "input": "x", "deadline_ms": -5}), 400),
            (client.post("/v1/generations", json={"model_alias": "no-such-model", "input": "x"}), 404),
        ]
    with platform.client("wrong-key") as client:
        cases.append((client.post("/v1/generations", json={"model_alias": MODEL_ALIAS, "input": "x"}), 401))
    for response, status in cases:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["message"] and error["type"]
    assert platform.worker.served == served_before
