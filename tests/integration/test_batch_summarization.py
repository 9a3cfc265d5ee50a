"""Summarization jobs: documents longer than the model's context go map-reduce, and the
output is a Parquet dataset on the real S3 server that pyarrow, pandas and DuckDB read
straight from S3, with the documented schema and a manifest."""
from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq

from models import batch_keys as keys
from models.events_batch import BatchChunkCompleted
from tests.harness import MODEL_ALIAS
from workers.tiny_corpus import CORPUS

pytest_plugins = ["tests.integration.batch_fixtures"]
CONTEXT = 512
SCHEMA = pa.schema([("id", pa.string()), ("summary", pa.string()), ("input_tokens", pa.int64()),
                    ("output_tokens", pa.int64()), ("finish_reason", pa.string()), ("model_revision", pa.string()),
                    ("error", pa.string())])
WORDS = CORPUS.split()


def text(n_words: int, start: int = 0) -> str:
    return " ".join(WORDS[(start + i) % len(WORDS)] for i in range(n_words))


def put_parquet(store, key: str, rows: list[dict]) -> None:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.string()), ("text", pa.string())])),
                   buffer)
    store.put_bytes(key, buffer.getvalue())


def fetch(http, job_id: str) -> SimpleNamespace:
    body = http.get(f"/v1/summarizations/{job_id}").json()
    return SimpleNamespace(status=body["status"], body=body)


def storage_options(settings) -> dict:
    return {"key": settings.s3_key, "secret": settings.s3_secret,
            "client_kwargs": {"endpoint_url": settings.s3_endpoint_url}}


def test_documents_longer_than_the_context_are_summarized_map_reduce_into_parquet_on_s3(batch_platform):
    import duckdb
    import pandas as pd
    import s3fs

    tenant, secret = batch_platform.tenant()
    store = batch_platform.store
    rows = [{"id": "short-1", "text": text(40)}, {"id": "long-1", "text": text(1400)},
            {"id": "empty", "text": "   "}, {"id": "short-1", "text": "a duplicate id"},
            {"id": None, "text": "no id"}, {"id": "long-2", "text": text(700, start=300)},
            {"id": "short-2", "text": text(25, start=900)}]
    input_key = keys.tenant_prefix(tenant) + "inputs/docs.parquet"
    put_parquet(store, input_key, rows)
    with batch_platform.http(secret) as http:
        created = http.post("/v1/summarizations", json={
            "model": MODEL_ALIAS, "input_url": store.uri(input_key), "max_output_tokens": 24,
            "prompt_template": "Summarize:\n{text}\nSummary:", "metadata": {"purpose": "test"}})
        assert created.status_code == 200, created.text
        job_id = created.json()["id"]
        assert created.json()["status"] == "validating"
        job = batch_platform.wait_terminal(lambda: fetch(http, job_id)).body
    assert job["status"] == "completed", job
    assert job["request_counts"] == {"total": 7, "completed": 4, "failed": 3}
    assert job["map_reduced"] == 2 and job["model_revision"] == batch_platform.model_revision

    fs = s3fs.S3FileSystem(**storage_options(batch_platform.settings))
    manifest = json.loads(fs.cat(job["manifest_uri"]))
    assert manifest["status"] == "completed" and manifest["map_reduced"] == 2 and manifest["rows"] == 7
    assert [(c["name"], c["type"]) for c in manifest["schema"]] == [(f.name, str(f.type)) for f in SCHEMA]

    table = pq.read_table(job["data_uri"].removeprefix("s3://"), filesystem=fs)
    assert table.schema.remove_metadata() == SCHEMA
    frame = pd.read_parquet(job["data_uri"], storage_options=storage_options(batch_platform.settings))
    con = duckdb.connect()
    con.register_filesystem(fs)
    ducked = con.sql(f"SELECT id, summary, input_tokens, error FROM read_parquet('{job['data_uri']}*.parquet') "
                     "ORDER BY id").fetchall()
    assert len(frame) == len(ducked) == table.num_rows == 7
    by_id = {r["id"]: r for r in table.to_pylist() if r["error"] is None}
    assert sorted(by_id) == ["long-1", "long-2", "short-1", "short-2"]
    for doc_id in ("long-1", "long-2"):
        # More input than one call can take: the document went through several calls.
        assert by_id[doc_id]["input_tokens"] > CONTEXT and by_id[doc_id]["summary"]
        assert by_id[doc_id]["output_tokens"] > 24
    for doc_id in ("short-1", "short-2"):
        assert by_id[doc_id]["input_tokens"] < CONTEXT and 0 < by_id[doc_id]["output_tokens"] <= 24
    assert {r["model_revision"] for r in table.to_pylist()} == {batch_platform.model_revision}
    errors = sorted(r["error"].split(":")[0] for r in table.to_pylist() if r["error"] is not None)
    assert errors == ["duplicate_id", "invalid_text", "missing_id"]
    assert all(r["summary"] is None for r in table.to_pylist() if r["error"] is not None)
    completed = [env.payload for _, env in batch_platform.events(tenant)
                 if isinstance(env.payload, BatchChunkCompleted) and env.payload.batch_id == job_id]
    assert sum(p.map_reduced for p in completed) == 2


def test_summarization_input_must_be_the_tenants_own_and_the_request_sound(batch_platform):
    tenant, secret = batch_platform.tenant()
    other, _ = batch_platform.tenant()
    store = batch_platform.store
    theirs = keys.tenant_prefix(other) + "inputs/private.parquet"
    put_parquet(store, theirs, [{"id": "a", "text": "secret text"}])
    base = {"model": MODEL_ALIAS, "max_output_tokens": 16}
    with batch_platform.http(secret) as http:
        def submit(**body):
            return http.post("/v1/summarizations", json={**base, **body})

        missing = submit(input_url=store.uri(keys.tenant_prefix(tenant) + "inputs/nope.parquet"))
        foreign = submit(input_url=store.uri(theirs))
        outside = submit(input_url="s3://some-other-bucket/docs.parquet")
        for response in (missing, foreign, outside):
            assert response.status_code == 404 and response.json()["error"]["code"] == "input_not_found"
        # Another tenant's object and a missing one are told apart by nothing but the URL.
        assert foreign.json()["error"]["message"].replace(store.uri(theirs), "X") == \
            missing.json()["error"]["message"].replace(store.uri(keys.tenant_prefix(tenant) +
                                                                 "inputs/nope.parquet"), "X")
        mine = keys.tenant_prefix(tenant) + "inputs/ok.parquet"
        put_parquet(store, mine, [{"id": "a", "text": "fine"}])
        assert submit(input_url=store.uri(mine), prompt_template="no placeholder").json()["error"]["code"] == \
            "invalid_prompt_template"
        too_long = submit(input_url=store.uri(mine), max_output_tokens=400)
        assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "invalid_max_output_tokens"
        assert submit(input_url=store.uri(mine), model="no-such-model").status_code == 404
        assert submit(input_url=store.uri(mine), input_file_id="file-x").status_code == 400
        store.put_bytes(keys.tenant_prefix(tenant) + "inputs/junk.bin", b"\x00\x01\x02binary")
        junk = submit(input_url=store.uri(keys.tenant_prefix(tenant) + "inputs/junk.bin"))
        assert junk.status_code == 400 and junk.json()["error"]["code"] == "invalid_file_format"
        assert http.get("/v1/summarizations").json()["data"] == []


def test_summarization_of_an_uploaded_jsonl_file(batch_platform):
    _, secret = batch_platform.tenant()
    data = "".join(json.dumps({"id": i, "text": text(30, start=i * 50)}) + "\n" for i in range(3)).encode()
    with batch_platform.http(secret) as http:
        upload = http.post("/v1/files", files={"file": ("docs.jsonl", data)}, data={"purpose": "user_data"})
        assert upload.status_code == 200, upload.text
        created = http.post("/v1/summarizations", json={"model": MODEL_ALIAS, "input_file_id": upload.json()["id"],
                                                        "max_output_tokens": 8})
        assert created.status_code == 200, created.text
        job = batch_platform.wait_terminal(lambda: fetch(http, created.json()["id"])).body
        assert job["status"] == "completed" and job["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
        assert [j["id"] for j in http.get("/v1/summarizations").json()["data"]] == [job["id"]]
    table = pq.read_table(job["data_uri"].removeprefix("s3://"), filesystem=batch_platform.store.fs)
    assert sorted(table.column("id").to_pylist()) == ["0", "1", "2"]  # ids are strings in the output
    assert all(0 < n <= 8 for n in table.column("output_tokens").to_pylist())
