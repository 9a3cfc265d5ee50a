"""`Idempotency-Key` on files, batches, summarizations and cancels, on each event log,
with the real batch platform: a retry gets the same object and nothing runs or is charged
twice, even from a fresh API app on the same log (a restart, or another replica); another
body with the same key is a 409 naming the key; a bad key is a 400 naming the header."""
from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

import httpx

from api.app import create_app
from tests.harness import MODEL_ALIAS, api_services, serve_api
from tests.integration.test_batch_api import jsonl, request_line

pytest_plugins = ["tests.integration.batch_fixtures"]


def types_of(plat, tenant_id: str) -> list[str]:
    return [env.event_type for _, env in plat.events(tenant_id)]


def upload(http, data: bytes, key: str | None, name: str = "input.jsonl", purpose: str = "batch"):
    headers = {"Idempotency-Key": key} if key is not None else {}
    return http.post("/v1/files", files={"file": (name, data)}, data={"purpose": purpose}, headers=headers)


class Restarted:
    """A second API app on the same log, served on its own port: what a restart (or another
    replica) would see."""

    def __init__(self, plat):
        self.plat = plat

    def __enter__(self):
        self.log = self.plat.open_log()  # its own handle, closed with it (the platform outlives this module)
        try:
            self.server, self.thread, port = serve_api(create_app(api_services(self.plat.settings, self.log)),
                                                       "batch-api-restarted")
        except BaseException:
            self.log.close()
            raise
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(15)
        self.log.close()


def test_a_file_and_a_batch_retried_with_their_keys_are_made_and_run_once(batch_platform):
    plat = batch_platform
    tenant_id, secret = plat.tenant()
    _, other_secret = plat.tenant()
    data = jsonl(request_line(f"r{i}", f"Entry {i}") for i in range(3))
    file_key, batch_key = str(uuid.uuid4()), str(uuid.uuid4())
    with plat.http(secret) as http, plat.http(other_secret) as other:
        first = upload(http, data, file_key)
        assert first.status_code == 200, first.text
        assert upload(http, data, file_key).json() == first.json(), "the same object"
        changed = upload(http, data + b"\n", file_key)
        assert changed.status_code == 409 and file_key in changed.json()["error"]["message"], changed.text
        assert changed.json()["error"]["param"] == "Idempotency-Key"
        renamed = upload(http, data, file_key, name="other.jsonl")
        assert renamed.status_code == 409, "the name is part of the body"
        theirs = upload(other, data, file_key)
        assert theirs.status_code == 200 and theirs.json()["id"] != first.json()["id"], "keys are per tenant"

        body = {"input_file_id": first.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        created = http.post("/v1/batches", json=body, headers={"Idempotency-Key": batch_key})
        assert created.status_code == 200, created.text
        again = http.post("/v1/batches", json=body, headers={"Idempotency-Key": batch_key})
        assert again.json() == created.json()
        other_body = http.post("/v1/batches", json={**body, "metadata": {"a": "b"}},
                               headers={"Idempotency-Key": batch_key})
        assert other_body.status_code == 409 and other_body.json()["error"]["code"] == "idempotency_key_reused"

        with Restarted(plat) as restarted, httpx.Client(base_url=restarted.base_url, timeout=60, headers={
                "Authorization": f"Bearer {secret}"}) as fresh:
            assert upload(fresh, data, file_key).json() == first.json()
            assert fresh.post("/v1/batches", json=body, headers={"Idempotency-Key": batch_key}).json() == \
                created.json(), "after a restart, the same batch"
            assert fresh.post("/v1/batches", json={**body, "metadata": {"a": "b"}},
                              headers={"Idempotency-Key": batch_key}).status_code == 409

        batch_id = created.json()["id"]
        done = plat.wait_terminal(lambda: SimpleNamespace(**http.get(f"/v1/batches/{batch_id}").json()))
        assert done.status == "completed" and done.request_counts["completed"] == 3
        assert [b["id"] for b in http.get("/v1/batches").json()["data"]] == [batch_id]
    types = types_of(plat, tenant_id)
    assert types.count("FileUploaded") == 2, "the input once, and the batch's output file"
    assert types.count("BatchSubmitted") == 1, "one batch, so one run and one charge"
    queued = types.count("BatchChunkQueued")
    assert queued >= 1 and types.count("BatchChunkCompleted") == queued, "every chunk ran once"


def test_cancels_and_summarizations_with_keys_and_bad_keys(batch_platform):
    plat = batch_platform
    tenant_id, secret = plat.tenant()
    with plat.http(secret) as http:
        file_id = upload(http, jsonl(request_line(f"r{i}") for i in range(40)), None).json()["id"]
        batch = http.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions"}).json()
        key = str(uuid.uuid4())
        cancel = http.post(f"/v1/batches/{batch['id']}/cancel", headers={"Idempotency-Key": key})
        assert cancel.status_code == 200, cancel.text
        assert http.post(f"/v1/batches/{batch['id']}/cancel", headers={"Idempotency-Key": key}).json() == \
            cancel.json(), "the first answer again"

        docs = "".join(json.dumps({"id": str(i), "text": f"document {i}"}) + "\n" for i in range(2)).encode()
        docs_id = upload(http, docs, None, name="docs.jsonl", purpose="user_data").json()["id"]
        summary = {"model": MODEL_ALIAS, "input_file_id": docs_id, "max_output_tokens": 4}
        skey = str(uuid.uuid4())
        job = http.post("/v1/summarizations", json=summary, headers={"Idempotency-Key": skey})
        assert job.status_code == 200, job.text
        assert http.post("/v1/summarizations", json=summary, headers={"Idempotency-Key": skey}).json() == job.json()
        reused = http.post("/v1/summarizations", json={**summary, "max_output_tokens": 5},
                           headers={"Idempotency-Key": skey})
        assert reused.status_code == 409 and skey in reused.json()["error"]["message"]
        ckey = str(uuid.uuid4())
        stopped = http.post(f"/v1/summarizations/{job.json()['id']}/cancel", headers={"Idempotency-Key": ckey})
        assert stopped.status_code in (200, 409), stopped.text  # 409: it had ended already
        if stopped.status_code == 200:
            assert http.post(f"/v1/summarizations/{job.json()['id']}/cancel",
                             headers={"Idempotency-Key": ckey}).json() == stopped.json()

        for bad in ("", "x" * 256):
            refused = http.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions"},
                                headers={"Idempotency-Key": bad})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "Idempotency-Key", refused.text
            refused = upload(http, b"{}\n", bad)
            assert refused.status_code == 400 and "Idempotency-Key" in refused.json()["error"]["message"]
    events = [env for _, env in plat.events(tenant_id)]
    assert [e.event_type for e in events].count("BatchSubmitted") == 2, "the batch and the summarization, once each"
    cancels = [e for e in events if e.event_type == "BatchCancelRequested" and e.payload.batch_id == batch["id"]]
    assert len(cancels) == 1
