"""A JSONL upload is JSONL wherever its long lines fall: `POST /v1/files`, and then a batch
and a summarization over it, all take a file whose first line is over 64 KiB."""
from __future__ import annotations

import json


from tests.e2e.api_alone import MODEL_ALIAS

PAD = "word " * 14_000  # ~70 KB: past the 64 KiB the format sniff once read


def jsonl(*rows: dict) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def request_line(custom_id: str, content: str) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": content}], "max_tokens": 2}}


def upload(client, content: bytes, name: str = "in.jsonl"):
    return client.post("/v1/files", files={"file": (name, content, "application/jsonl")}, data={"purpose": "batch"})


def test_a_long_first_line_is_jsonl_for_files_batches_and_summarizations(api):
    _, secret = api.tenant()
    with api.client(secret) as client:
        for content in (jsonl(request_line("a", PAD), request_line("b", "hi")),
                        jsonl(request_line("a", "hi"), request_line("b", PAD)),
                        jsonl(request_line("a", PAD))):
            uploaded = upload(client, content)
            assert uploaded.status_code == 200, uploaded.text
            batch = client.post("/v1/batches", json={"input_file_id": uploaded.json()["id"],
                                                     "endpoint": "/v1/chat/completions"})
            assert batch.status_code == 200 and batch.json()["status"] == "validating", batch.text
        docs = upload(client, jsonl({"id": "1", "text": PAD}, {"id": "2", "text": "short"}), "docs.jsonl")
        assert docs.status_code == 200, docs.text
        job = client.post("/v1/summarizations", json={"model": MODEL_ALIAS, "input_file_id": docs.json()["id"]})
        assert job.status_code == 200, job.text
        binary = upload(client, b"\x89PNG\r\n\x1a\n" + b"\x00" * 70_000, "x.png")
        assert binary.status_code == 400 and binary.json()["error"]["code"] == "invalid_file_format"
