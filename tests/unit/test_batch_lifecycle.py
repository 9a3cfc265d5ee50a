"""The batch lifecycle fold (`models.batch`) and batch budgets (`models.batch_budget`):
what the API shows and what the dispatcher decides on."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from models.batch import BatchBook
from models.batch_budget import BatchLimits, BudgetBook, TenantBatchBudget
from models.events import new_event
from models.events_batch import (
    BatchCancelRequested, BatchChunkCompleted, BatchChunkFailed, BatchChunkQueued, BatchChunkSkipped,
    BatchChunkStarted, BatchCompleted, BatchFinalizationStarted, BatchSubmitted, BatchUsageSettled, BatchValidated,
    ChunkPlan, FileUploaded, RequestCounts,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def env(payload, tenant="acme", at=T0):
    correlation = getattr(payload, "batch_id", None) or "x"
    return new_event(payload, tenant_id=tenant, correlation_id=correlation, occurred_at=at)


def submitted(batch_id="b1"):
    return BatchSubmitted(batch_id=batch_id, endpoint="/v1/chat/completions", input_file_id="file-1",
                          input_key="tenants/acme/files/file-1", expires_at=T0 + timedelta(hours=24))


def validated(batch_id="b1", chunks=3, per_chunk=2, invalid=1):
    return BatchValidated(batch_id=batch_id, model_alias="tiny", model_revision="tiny@abc",
                          total_requests=chunks * per_chunk + invalid, invalid_requests=invalid,
                          chunks=tuple(ChunkPlan(chunk_index=i, requests=per_chunk, tokens=100, cost_micros=10)
                                       for i in range(chunks)))


def completed(index, batch_id="b1", ok=2, failed=0):
    return BatchChunkCompleted(batch_id=batch_id, chunk_index=index, part_key=f"p{index}", completed=ok,
                               failed=failed, input_tokens=10, output_tokens=20, model_revision="tiny@abc",
                               worker_id="w")


def book_with(*payloads, tenant="acme"):
    book = BatchBook()
    for p in payloads:
        book.apply(env(p, tenant))
    return book


def test_submitted_batch_is_validating_then_in_progress_with_counts():
    book = book_with(submitted())
    assert book.batches[("acme", "b1")].status == "validating"
    book.apply(env(validated()))
    batch = book.batches[("acme", "b1")]
    assert batch.status == "in_progress"
    assert batch.request_counts == RequestCounts(total=7, completed=0, failed=1)


def test_counts_follow_chunks_and_a_repeated_report_changes_nothing():
    book = book_with(submitted(), validated(), completed(0, ok=1, failed=1), completed(0, ok=2),
                     BatchChunkSkipped(batch_id="b1", chunk_index=1, reason="insufficient_quota"))
    batch = book.batches[("acme", "b1")]
    assert batch.request_counts == RequestCounts(total=7, completed=1, failed=1 + 1 + 2)
    assert batch.chunks[0].part_key == "p0" and batch.usage == (10, 20)


def test_completion_reported_before_its_queued_event_still_counts_and_keeps_the_reservation():
    book = book_with(submitted(), validated(), completed(0),
                     BatchChunkQueued(batch_id="b1", chunk_index=0, reservation_id="r0", tokens=100, cost_micros=10))
    chunk = book.batches[("acme", "b1")].chunks[0]
    assert chunk.status == "completed" and chunk.reservation_id == "r0" and chunk.needs_settlement


def test_cancel_moves_to_cancelling_and_end_events_are_final():
    book = book_with(submitted(), validated(), BatchCancelRequested(batch_id="b1"))
    batch = book.batches[("acme", "b1")]
    assert batch.status == "cancelling" and batch.stopping
    book.apply(env(BatchFinalizationStarted(batch_id="b1")))
    assert batch.status == "cancelling"  # finalizing a cancelled batch still reads as cancelling
    book.apply(env(BatchCompleted(batch_id="b1", request_counts=RequestCounts(total=7, completed=7))))
    book.apply(env(BatchChunkFailed(batch_id="b1", chunk_index=2, error_code="x", message="late")))
    assert batch.status == "completed" and batch.chunks[2].status == "pending"


def test_cancel_of_a_finalizing_batch_is_ignored():
    book = book_with(submitted(), validated(chunks=1), completed(0), BatchFinalizationStarted(batch_id="b1"),
                     BatchCancelRequested(batch_id="b1"))
    assert book.batches[("acme", "b1")].status == "finalizing"


def test_all_chunks_terminal_waits_for_settlement():
    book = book_with(submitted(), validated(chunks=1),
                     BatchChunkQueued(batch_id="b1", chunk_index=0, reservation_id="r0", tokens=100, cost_micros=10),
                     BatchChunkStarted(batch_id="b1", chunk_index=0, worker_id="w", attempt=1), completed(0))
    batch = book.batches[("acme", "b1")]
    assert not batch.all_chunks_terminal()
    book.apply(env(BatchUsageSettled(batch_id="b1", chunk_index=0, reservation_id="r0", input_tokens=10,
                                     output_tokens=20, cost_micros=5, released_tokens=70, released_cost_micros=5)))
    assert batch.all_chunks_terminal()


def test_tenants_are_apart_in_the_book():
    book = book_with(submitted("b1"), tenant="acme")
    book.apply(env(submitted("b1"), tenant="other"))
    book.apply(env(FileUploaded(file_id="f", purpose="batch", filename="a", bytes=1, object_key="k", sha256="s"),
                   tenant="other"))
    book.apply(env(BatchCancelRequested(batch_id="b1"), tenant="other"))
    assert book.batches[("acme", "b1")].status == "validating"
    assert book.batches[("other", "b1")].status == "cancelling"
    assert ("acme", "f") not in book.files and ("other", "f") in book.files
    assert [b.tenant_id for b in book.for_tenant("acme")] == ["acme"]


def test_budget_counts_open_reservations_and_recent_use_and_never_charges_above_reserved():
    budget = TenantBatchBudget()
    limits = BatchLimits(tokens_per_window=1000)
    budget.reserve("r1", 600, 0)
    assert budget.fits(limits, 400, 0, T0) and not budget.fits(limits, 401, 0, T0)
    budget.settle("r1", T0, 900, 0)  # reported more than reserved: charged at the reservation
    assert budget.committed(T0) == (600, 0)
    budget.settle("r1", T0, 10, 0)  # settles once
    assert budget.committed(T0) == (600, 0)
    assert budget.committed(T0 + timedelta(days=1, seconds=1)) == (0, 0)


def test_budget_spend_limit_and_window_from_limits():
    budget = TenantBatchBudget()
    budget.reserve("r1", 10, 500)
    budget.settle("r1", T0, 10, 400)
    hourly = BatchLimits(spend_per_window_micros=500, window=timedelta(hours=1))
    assert not budget.fits(hourly, 1, 101, T0 + timedelta(minutes=30))
    assert budget.fits(hourly, 1, 101, T0 + timedelta(minutes=61))


def test_budget_book_folds_reservations_and_settlements_idempotently():
    book = BudgetBook()
    queued = env(BatchChunkQueued(batch_id="b1", chunk_index=0, reservation_id="r0", tokens=100, cost_micros=10))
    settled = env(BatchUsageSettled(batch_id="b1", chunk_index=0, reservation_id="r0", input_tokens=10,
                                    output_tokens=20, cost_micros=3, released_tokens=70, released_cost_micros=7))
    for e in (queued, settled, queued, settled):
        book.apply(e)
    assert book.of("acme").open == {} and book.of("acme").committed(T0) == (30, 3)
