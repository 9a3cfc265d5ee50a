"""A request_id its client chose comes back as `request_id` wherever the generation is
shown: every frame of its stream (and of `.../events`), the collected answer, its status
(asked by either id), a cancel's answer and the console's generation rows; `id` stays the
generation's own `gen_` id. Reusing a chosen request_id is a 409 naming both.
On the embedded log and on Kafka."""
from __future__ import annotations

import re
import uuid

import sqlalchemy as sa

from pipelines.admin import commands as admin_commands
from tests.e2e.console_fixture import console_platform  # noqa: F401 - the console's shared platform
from tests.e2e.test_streaming import sse_frames
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until

BODY = {"model_alias": MODEL_ALIAS, "input": "hello there", "max_output_tokens": 6, "ignore_eos": True}


def chosen_id(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


def stream_frames(client, path: str, body: dict | None = None) -> tuple[dict, list[dict]]:
    """(headers, the data frames before [DONE]) of a streamed POST (with `body`) or GET."""
    method = "POST" if body is not None else "GET"
    with client.stream(method, path, json=body) as response:
        assert response.status_code == 200, response.read()
        frames = [data for _, data in sse_frames(response)]
    assert frames[-1] == "[DONE]"
    return dict(response.headers), frames[:-1]


def test_every_frame_of_a_stream_echoes_the_request_id_its_client_chose(platform):
    _, secret = platform.tenant()
    chosen = chosen_id("long")
    with platform.client(secret) as client:
        headers, frames = stream_frames(client, "/v1/generations", {**BODY, "request_id": chosen})
        gen_id = headers["x-request-id"]
        assert gen_id.startswith("gen_") and gen_id != chosen
        assert frames[0]["type"] == "started" and frames[-1]["type"] == "completed"
        assert any(f["type"] == "tokens" for f in frames)
        assert [(f["request_id"], f["id"]) for f in frames] == [(chosen, gen_id)] * len(frames), frames
        # The same frames read again, by either id.
        for asked in (chosen, gen_id):
            _, again = stream_frames(client, f"/v1/generations/{asked}/events")
            assert again == frames
        # Its status, asked by the chosen id or by the generation's own.
        for asked in (chosen, gen_id):
            status = client.get(f"/v1/generations/{asked}")
            assert status.status_code == 200, status.text
            assert status.json()["id"] == gen_id and status.json()["request_id"] == chosen, status.json()
            assert status.json()["status"] in ("running", "completed")
        cancel = client.post(f"/v1/generations/{chosen}/cancel")
        assert cancel.status_code == 200, cancel.text
        assert (cancel.json()["id"], cancel.json()["request_id"]) == (gen_id, chosen)


def test_a_collected_answer_echoes_it_and_one_with_none_keeps_its_id_as_request_id(platform):
    _, secret = platform.tenant()
    chosen = chosen_id("collected")
    with platform.client(secret) as client:
        answer = client.post("/v1/generations", json={**BODY, "request_id": chosen, "stream": False})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["type"] == "completed" and body["output"]
        assert body["request_id"] == chosen
        assert body["id"].startswith("gen_") and body["id"] == answer.headers["x-request-id"]

        plain = client.post("/v1/generations", json={**BODY, "stream": False})
        assert plain.status_code == 200, plain.text
        assert plain.json()["request_id"] == plain.json()["id"] == plain.headers["x-request-id"]
        status = client.get(f"/v1/generations/{plain.json()['id']}").json()
        assert status["request_id"] == status["id"] == plain.json()["id"]
        headers, frames = stream_frames(client, "/v1/generations", BODY)
        assert {(f["request_id"], f["id"]) for f in frames} == {(headers["x-request-id"],) * 2}


def test_reusing_a_request_id_is_a_409_naming_it_and_the_generation_using_it(platform):
    _, secret = platform.tenant()
    chosen = chosen_id("again")
    with platform.client(secret) as client:
        first = client.post("/v1/generations", json={**BODY, "request_id": chosen, "stream": False})
        assert first.status_code == 200, first.text
        for stream in (False, True):
            reused = client.post("/v1/generations", json={**BODY, "request_id": chosen, "stream": stream})
            assert reused.status_code == 409, reused.text
            error = reused.json()["error"]
            assert (error["code"], error["param"], error["type"]) == ("request_id_in_use", "request_id",
                                                                      "conflict_error")
            message = error["message"]
            assert f"'{chosen}'" in message and "already used" in message, message
            assert first.json()["id"] in message, message
            assert "\n" not in message and "Traceback" not in reused.text


def test_the_console_shows_the_request_id_a_client_chose_beside_the_generation_id(console_platform):  # noqa: F811
    cp = console_platform
    platform = cp.platform
    # A tenant of its own: the console tests' tenants keep the counts they expect.
    tenant_id, admin = platform.tenant(scopes=("tenant_admin",), application="admin")
    chosen = chosen_id("console")
    generate, _ = admin_commands.issue_key(platform.view, tenant_id=tenant_id, actor="tests",
                                           application_id="chat", scopes=("generate",))
    with platform.client(generate) as client:
        chose = client.post("/v1/generations", json={**BODY, "request_id": chosen, "stream": False})
        plain = client.post("/v1/generations", json={**BODY, "stream": False})
    assert chose.status_code == plain.status_code == 200, (chose.text, plain.text)

    def projected() -> bool:  # admission settles each a moment after its answer
        cp.project()
        with cp.engine.connect() as conn:
            return conn.execute(sa.text("SELECT COUNT(*) FROM usage_ledger WHERE tenant_id = :t"),
                                {"t": tenant_id}).scalar() == 2
    wait_until(projected, 60, every_s=0.2, what="both generations settled and projected")
    with cp.signed_in(admin) as browser:
        page = browser.get("/console/generations").text
    rows = dict(re.findall(r'<tr class="generation" data-request-id="([^"]+)"(.*?)</tr>', page, re.S))
    assert set(rows) == {chose.json()["id"], plain.json()["id"]}, page
    assert re.search(rf'class="tag chosen-request-id"[^>]*>{re.escape(chosen)}<', rows[chose.json()["id"]])
    assert "chosen-request-id" not in rows[plain.json()["id"]]
