"""The objects the batch API returns validate as the `openai` client's own types, lists
page the way its cursor pagination expects, and the CLI's progress line adds up."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import openai.types as oa

from api.cli.batch import progress_line
from api.routes.batch_deps import batch_object, file_object, page
from models.batch import BatchBook
from models.events import new_event
from models.events_batch import BatchCompleted, BatchSubmitted, BatchValidated, ChunkPlan, FileUploaded, RequestCounts

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def book_with_batches(n: int) -> BatchBook:
    book = BatchBook()
    for i in range(n):
        book.apply(new_event(BatchSubmitted(batch_id=f"batch_{i}", endpoint="/v1/chat/completions",
                                            input_file_id="file-1", input_key="k", expires_at=T0 + timedelta(days=1),
                                            metadata={"n": str(i)}),
                             tenant_id="acme", correlation_id=f"batch_{i}", occurred_at=T0 + timedelta(seconds=i)))
    return book


def test_batch_objects_validate_as_openai_batches_in_every_state():
    book = book_with_batches(1)
    state = book.batches[("acme", "batch_0")]
    assert oa.Batch.model_validate(batch_object(state)).status == "validating"
    book.apply(new_event(BatchValidated(batch_id="batch_0", model_alias="tiny", model_revision="r", total_requests=3,
                                        invalid_requests=1, chunks=(ChunkPlan(chunk_index=0, requests=2, tokens=9,
                                                                              cost_micros=0),)),
                         tenant_id="acme", correlation_id="batch_0", occurred_at=T0))
    book.apply(new_event(BatchCompleted(batch_id="batch_0", output_file_id="file-o", error_file_id="file-e",
                                        request_counts=RequestCounts(total=3, completed=2, failed=1)),
                         tenant_id="acme", correlation_id="batch_0", occurred_at=T0 + timedelta(minutes=1)))
    batch = oa.Batch.model_validate(batch_object(state))
    assert batch.status == "completed" and batch.request_counts.completed == 2
    assert batch.completed_at == int((T0 + timedelta(minutes=1)).timestamp()) and batch.output_file_id == "file-o"
    assert batch.metadata == {"n": "0"} and batch.model == "tiny"


def test_file_objects_validate_as_openai_files():
    book = BatchBook()
    book.apply(new_event(FileUploaded(file_id="file-1", purpose="batch", filename="in.jsonl", bytes=10,
                                      object_key="k", sha256="s"), tenant_id="acme", correlation_id="file-1"))
    f = oa.FileObject.model_validate(file_object(book.files[("acme", "file-1")]))
    assert (f.id, f.purpose, f.bytes, f.object) == ("file-1", "batch", 10, "file")


def test_pages_are_newest_first_and_follow_the_after_cursor():
    batches = book_with_batches(5).for_tenant("acme")
    first = page(batches, batch_object, after=None, limit=2)
    assert [b["id"] for b in first["data"]] == ["batch_4", "batch_3"] and first["has_more"]
    second = page(batches, batch_object, after=first["last_id"], limit=2)
    third = page(batches, batch_object, after=second["last_id"], limit=2)
    assert [b["id"] for b in second["data"] + third["data"]] == ["batch_2", "batch_1", "batch_0"]
    assert not third["has_more"] and third["last_id"] == "batch_0"


def test_progress_line_counts_requests_done_and_output_tokens_per_second():
    job = {"status": "in_progress", "request_counts": {"total": 10, "completed": 4, "failed": 1},
           "usage": {"output_tokens": 700}}
    line = progress_line(job, {"output_tokens": 100}, elapsed_s=3.0)
    assert line == {"done": 5, "total": 10, "tokens_per_s": 200.0, "status": "in_progress", "detail": None}
