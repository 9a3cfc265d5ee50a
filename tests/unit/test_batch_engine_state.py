"""What a tenant sees of offline jobs beyond their OpenAI status: the engine a worker is
starting, the Parquet parts of an ended summarization, and one listing of both kinds."""
from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import httpx
import openai.types as oa
import pytest

from api.cli.batch import list_jobs, progress_line
from api.routes.batch_deps import batch_object
from models.batch import ENGINE_STARTING, BatchBook
from models.events import new_event
from models.events_batch import (
    BatchChunkCompleted, BatchChunkQueued, BatchChunkStarted, BatchCompleted, BatchEngineStarted, BatchEngineStarting,
    BatchSubmitted, BatchValidated, ChunkPlan, RequestCounts, SummarizationSpec,
)
from pipelines.batch.output import open_part, output_parts
from pipelines.generation.submission import SubmissionError
from pipelines.objectstore import open_object_store
from workers.batch_engine import EngineSlot

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def fold(book: BatchBook, *payloads, batch_id: str = "b1"):
    for p in payloads:
        book.apply(new_event(p, tenant_id="acme", correlation_id=batch_id, occurred_at=T0))
    return book.batches[("acme", batch_id)]


def running_batch(spec: SummarizationSpec | None = None) -> BatchBook:
    book = BatchBook()
    fold(book, BatchSubmitted(batch_id="b1", endpoint="/v1/summarizations" if spec else "/v1/chat/completions",
                              input_key="k", input_file_id="file-1", expires_at=T0 + timedelta(days=1), summarization=spec,
                              model_alias="tiny" if spec else None),
         BatchValidated(batch_id="b1", model_alias="tiny", model_revision="r", total_requests=2, invalid_requests=0,
                        chunks=(ChunkPlan(chunk_index=0, requests=2, tokens=9, cost_micros=0),)),
         BatchChunkQueued(batch_id="b1", chunk_index=0, reservation_id="res", tokens=9, cost_micros=0))
    return book


def test_a_batch_says_it_is_starting_the_engine_only_between_the_workers_two_reports():
    book = running_batch()
    started = BatchChunkStarted(batch_id="b1", chunk_index=0, worker_id="w", attempt=1)
    starting = BatchEngineStarting(batch_id="b1", chunk_index=0, worker_id="w")
    state = fold(book, started)
    assert state.status_detail is None, "a warm engine runs the chunk at once: nothing to say"
    fold(book, starting)
    body = batch_object(state)
    assert body["status_detail"] == ENGINE_STARTING == "starting the batch engine"
    assert oa.Batch.model_validate(body).status == "in_progress", "the OpenAI status is unchanged"
    fold(book, BatchEngineStarted(batch_id="b1", chunk_index=0, worker_id="w", duration_ms=14_000))
    assert batch_object(state)["status_detail"] is None
    # An attempt that died while starting: the retry's start clears it until it reports its own.
    fold(book, starting, BatchChunkStarted(batch_id="b1", chunk_index=0, worker_id="w2", attempt=2))
    assert state.status_detail is None
    fold(book, starting, BatchChunkCompleted(batch_id="b1", chunk_index=0, part_key="p", completed=2, failed=0,
                                             input_tokens=5, output_tokens=4, model_revision="r", worker_id="w"))
    assert state.status_detail is None, "a finished chunk is not starting anything"


def test_the_engine_slot_reports_a_start_around_making_the_engine_and_not_a_warm_reuse(tmp_path):
    from workers.vllm_engine import VllmEngineConfig, engine_config_hash

    said = []
    slot = EngineSlot({}, factory=lambda config: said.append("made") or object())
    pinned = engine_config_hash(VllmEngineConfig(model=tmp_path, max_model_len=64))

    def get():
        return slot.get(model_path=str(tmp_path), max_model_len=64, pinned_hash=pinned,
                        on_starting=lambda: said.append("starting"), on_started=lambda s: said.append(("up", s >= 0)))
    assert get() is get()
    assert said == ["starting", "made", ("up", True)]


def test_the_progress_line_carries_the_status_detail():
    job = {"status": "in_progress", "status_detail": ENGINE_STARTING, "request_counts": {"total": 4},
           "usage": {"output_tokens": 0}}
    assert progress_line(job, {}, elapsed_s=1.0)["detail"] == ENGINE_STARTING


def test_batch_list_holds_both_kinds_newest_first():
    pages = {"/v1/batches": [{"id": "batch_b", "status": "completed", "request_counts": {}, "created_at": 30},
                             {"id": "batch_a", "status": "failed", "request_counts": {}, "created_at": 10}],
             "/v1/summarizations": [{"id": "summ_x", "status": "in_progress", "request_counts": {}, "created_at": 20}]}
    client = httpx.Client(base_url="http://api", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json={"data": pages[request.url.path]})))
    jobs = list_jobs(client)
    assert [(j["id"], j["kind"]) for j in jobs] == [("batch_b", "batch"), ("summ_x", "summarization"),
                                                      ("batch_a", "batch")]


def summarization_store():
    store = open_object_store(f"memory://{uuid.uuid4().hex}")
    spec = SummarizationSpec(input_format="parquet", spec_key="s", template_sha256="h", max_output_tokens=8,
                             output_prefix="tenants/acme/out/b1/")
    return store, spec


def test_a_running_summarization_has_no_output_to_download_yet():
    store, spec = summarization_store()
    state = fold(running_batch(spec), BatchChunkStarted(batch_id="b1", chunk_index=0, worker_id="w", attempt=1))
    with pytest.raises(SubmissionError) as refused:
        output_parts(state, store)
    assert refused.value.status == 409 and refused.value.code == "output_not_ready"
    assert "in_progress" in str(refused.value) and "\n" not in str(refused.value)


def test_an_ended_summarization_serves_only_the_parts_its_manifest_lists():
    store, spec = summarization_store()
    prefix = spec.output_prefix
    store.put_bytes(prefix + "data/part-00000.parquet", b"PAR1 part")
    store.put_bytes(prefix + "data/part-errors.parquet", b"PAR1 errors")
    store.put_bytes("tenants/other/secret.parquet", b"not yours")
    files = [{"uri": store.uri(prefix + "data/part-00000.parquet"), "rows": 2},
             {"uri": store.uri(prefix + "data/part-errors.parquet"), "rows": 1},
             {"uri": store.uri("tenants/other/secret.parquet"), "rows": 9}]
    store.put_bytes(prefix + "manifest.json", json.dumps({"status": "completed", "files": files}).encode())
    state = fold(running_batch(spec), BatchCompleted(batch_id="b1", output_uri=store.uri(prefix),
                                                     request_counts=RequestCounts(total=2, completed=2)))
    manifest, parts = output_parts(state, store)
    assert manifest["status"] == "completed"
    assert [(p.name, p.rows, p.bytes) for p in parts] == [("part-00000.parquet", 2, 9), ("part-errors.parquet", 1, 11)]
    part, reader = open_part(state, store, "part-errors.parquet")
    with reader:
        assert reader.read() == b"PAR1 errors"
    for name in ("secret.parquet", "../manifest.json", "part-00001.parquet"):
        with pytest.raises(SubmissionError) as missing:
            open_part(state, store, name)
        assert missing.value.status == 404
