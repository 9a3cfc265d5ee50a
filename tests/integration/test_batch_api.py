"""The OpenAI Batch API with the official `openai` client, on real Redis, a real S3 server
and a real Celery worker process, on each event log."""
from __future__ import annotations

import io
import json

import openai
import pytest

from tests.harness import MODEL_ALIAS

pytest_plugins = ["tests.integration.batch_fixtures"]


def request_line(custom_id: str, prompt: str = "The ledger says", *, max_tokens: int = 8,
                 url: str = "/v1/chat/completions", **body) -> dict:
    payload = {"model": MODEL_ALIAS, "max_tokens": max_tokens, "temperature": 0, **body}
    if url == "/v1/chat/completions":
        payload.setdefault("messages", [{"role": "user", "content": prompt}])
    else:
        payload.setdefault("prompt", prompt)
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": payload}


def jsonl(lines) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def upload(client, data: bytes, name: str = "input.jsonl"):
    return client.files.create(file=(name, io.BytesIO(data)), purpose="batch")


def run_batch(plat, client, data: bytes, endpoint: str = "/v1/chat/completions", **create):
    file = upload(client, data)
    batch = client.batches.create(input_file_id=file.id, endpoint=endpoint, completion_window="24h", **create)
    assert batch.status == "validating" and batch.input_file_id == file.id
    return plat.wait_terminal(lambda: client.batches.retrieve(batch.id))


def lines_of(client, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_round_trip_with_the_openai_client(batch_platform):
    _, secret = batch_platform.tenant()
    client = batch_platform.openai(secret)
    ids = [f"req-{i}" for i in range(10)]
    done = run_batch(batch_platform, client, jsonl(request_line(i, f"Entry {n} of the ledger") for n, i in
                                                    enumerate(ids)), metadata={"team": "ledger"})
    assert done.status == "completed", done
    assert done.request_counts.total == 10 and done.request_counts.completed == 10 and done.request_counts.failed == 0
    assert done.metadata == {"team": "ledger"} and done.error_file_id is None
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output = lines_of(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(ids)  # every custom_id exactly once
    for line in output:
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert body["object"] == "chat.completion" and body["model"] == MODEL_ALIAS
        assert body["system_fingerprint"] == batch_platform.model_revision
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert 0 < body["usage"]["completion_tokens"] <= 8
    usage = sum(line["response"]["body"]["usage"]["completion_tokens"] for line in output)
    assert done.usage.output_tokens == usage
    meta = client.files.retrieve(done.output_file_id)
    assert meta.purpose == "batch_output" and meta.bytes == len(client.files.content(done.output_file_id).content)


def test_completions_endpoint_round_trip(batch_platform):
    _, secret = batch_platform.tenant()
    client = batch_platform.openai(secret)
    done = run_batch(batch_platform, client, jsonl(request_line(f"c{i}", url="/v1/completions", max_tokens=4)
                                                    for i in range(3)), endpoint="/v1/completions")
    assert done.status == "completed"
    output = lines_of(client, done.output_file_id)
    assert {line["response"]["body"]["object"] for line in output} == {"text_completion"}
    assert sorted(line["custom_id"] for line in output) == ["c0", "c1", "c2"]


def test_malformed_lines_and_duplicate_ids_go_to_the_error_file_and_the_rest_complete(batch_platform):
    _, secret = batch_platform.tenant()
    client = batch_platform.openai(secret)
    lines = [
        request_line("good-1"),
        "this is not json",
        {"method": "POST", "url": "/v1/chat/completions", "body": {"model": MODEL_ALIAS}},  # no custom_id
        request_line("good-2"),
        request_line("good-1"),  # duplicate custom_id
        request_line("wrong-url", url="/v1/completions"),
        request_line("no-model", model="no-such-model"),
        request_line("too-long", max_tokens=100_000),
        {"custom_id": "bad-body", "method": "POST", "url": "/v1/chat/completions", "body": {"model": MODEL_ALIAS}},
        request_line("good-3"),
    ]
    done = run_batch(batch_platform, client, jsonl(lines))
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (10, 3, 7)
    assert sorted(line["custom_id"] for line in lines_of(client, done.output_file_id)) == \
        ["good-1", "good-2", "good-3"]
    errors = {line["error"]["line"]: line for line in lines_of(client, done.error_file_id)}
    assert {n: e["error"]["code"] for n, e in errors.items()} == {
        2: "invalid_json", 3: "invalid_request", 5: "duplicate_custom_id", 6: "invalid_url",
        7: "model_not_found", 8: "context_length_exceeded", 9: "invalid_request"}
    assert errors[5]["custom_id"] == "good-1" and errors[3]["custom_id"] is None
    assert all(e["response"] is None and e["error"]["message"] for e in errors.values())


def test_bad_input_is_refused_at_submit_with_a_clear_error(batch_platform):
    _, secret = batch_platform.tenant()
    client = batch_platform.openai(secret)
    with pytest.raises(openai.BadRequestError) as err:
        upload(client, b"\x89PNG\r\n\x1a\n\x00\x00\x00binary", "image.png")
    assert err.value.body["code"] == "invalid_file_format"
    with pytest.raises(openai.APIStatusError) as err:
        upload(client, b'{"custom_id": "x"}\n' * 60_000)  # over the test platform's 1 MB limit
    assert err.value.status_code == 413 and err.value.body["code"] == "file_too_large"
    good = upload(client, jsonl([request_line("a")]))
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(input_file_id=good.id, endpoint="/v1/embeddings", completion_window="24h")
    assert err.value.body["code"] == "unsupported_endpoint" and err.value.body["param"] == "endpoint"
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="1h")
    assert err.value.body["code"] == "invalid_completion_window"
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions", completion_window="24h")
    parquet = upload(client, b"PAR1" + b"\x00" * 64 + b"PAR1", "docs.parquet")  # a summarization input
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(input_file_id=parquet.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert err.value.body["code"] == "invalid_file_format" and "not JSONL" in err.value.body["message"]


def test_another_tenants_batches_and_files_are_not_found(batch_platform):
    _, secret_a = batch_platform.tenant()
    _, secret_b = batch_platform.tenant()
    a, b = batch_platform.openai(secret_a), batch_platform.openai(secret_b)
    file = upload(a, jsonl([request_line("x")]))
    batch = a.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (lambda: b.batches.retrieve(batch.id), lambda: b.batches.cancel(batch.id),
                 lambda: b.files.retrieve(file.id), lambda: b.files.content(file.id),
                 lambda: b.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                          completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert [x.id for x in b.batches.list()] == [] and [x.id for x in b.files.list()] == []
    with batch_platform.http(secret_b) as http:  # a scope is needed too
        assert http.get(f"/v1/batches/{batch.id}").status_code == 404
    _, no_batch_scope = batch_platform.tenant(scopes=("generate",))
    with batch_platform.http(no_batch_scope) as http:
        assert http.get("/v1/batches").status_code == 403
    with batch_platform.http(None) as http:
        assert http.get("/v1/batches").status_code == 401
    assert batch_platform.wait_terminal(lambda: a.batches.retrieve(batch.id)).status == "completed"


def test_list_is_paginated_newest_first_and_holds_only_the_tenants_own(batch_platform):
    _, secret = batch_platform.tenant()
    client = batch_platform.openai(secret)
    file = upload(client, jsonl([request_line("x", max_tokens=2)]))
    created = [client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                     completion_window="24h").id for _ in range(3)]
    first = client.batches.list(limit=2)
    assert len(first.data) == 2 and first.has_more
    assert [b.id for b in client.batches.list(limit=2).iter_pages().__next__().data] == [b.id for b in first.data]
    assert sorted(b.id for b in client.batches.list(limit=2)) == sorted(created)  # auto-paginates
    for batch_id in created:
        batch_platform.wait_terminal(lambda: client.batches.retrieve(batch_id))
