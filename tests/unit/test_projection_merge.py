"""The merge rules of the generations and batches projections: the row a generation ends
with must not depend on the order its events arrive in from different topics, because
a replay reads topics at a different pace than the live projector did."""
from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone

from models import topics
from models.events import encode, new_event
from models.events_batch import BatchChunkCompleted, BatchChunkQueued, BatchUsageSettled
from models.events_generation import (
    BudgetReserved, CancelRequested, GenerationAdmitted, GenerationCompleted, GenerationFailed, GenerationRejected,
    GenerationRequested, GenerationStarted, OutputDelivered, Position, ReservationExpired, Timings, UsageSettled,
)
from pipelines.eventlog import Record
from pipelines.projections import batches as batch_rules
from pipelines.projections.base import Event, parse_record, schema_versions
from pipelines.projections.generations import merge, new_row, usage_row

T0 = datetime(2025, 5, 1, 12, 0, tzinfo=timezone.utc)
VERSIONS = schema_versions()


def as_event(payload, topic, offset: int, ms: int = 0, tenant: str = "acme", corr: str = "gen_1") -> Event:
    env = new_event(payload, tenant_id=tenant, correlation_id=corr, occurred_at=T0 + timedelta(milliseconds=ms))
    return parse_record(Record(topic.name, 0, offset, tenant, encode(env), 0), VERSIONS)


def requested(offset=0):
    return as_event(GenerationRequested(
        request_id="gen_1", application_id="chat", key_id="key_1", model_alias="tiny", model_revision="tiny@r1",
        input_tokens=40, input_sha256="00" * 32, max_output_tokens=100,
        prompt_ref=Position(topic=topics.PROMPTS.name, partition=0, offset=0)), topics.REQUESTS, offset)


def ledger(payload, offset, ms):
    return as_event(payload, topics.LEDGER, offset, ms)


def outcome(payload, offset, ms):
    return as_event(payload, topics.OUTCOMES, offset, ms)


TIMINGS = Timings(queued_ms=7, ttft_ms=20, duration_ms=300)


def completed_generation() -> list[Event]:
    return [
        requested(),
        ledger(BudgetReserved(request_id="gen_1", reservation_id="res_1", tokens=140, cost_micros=50,
                              expires_at=T0 + timedelta(minutes=5)), 0, 1),
        ledger(GenerationAdmitted(request_id="gen_1", reservation_id="res_1", work_topic="w"), 1, 1),
        outcome(GenerationStarted(request_id="gen_1", worker_id="w1", model_revision="tiny@r1", queued_ms=7), 0, 7),
        outcome(GenerationCompleted(request_id="gen_1", finish_reason="stop", input_tokens=40, output_tokens=12,
                                    model_revision="tiny@r1", output_sha256="11" * 32, timings=TIMINGS), 1, 300),
        ledger(UsageSettled(request_id="gen_1", reservation_id="res_1", terminal_status="completed",
                            input_tokens=40, output_tokens=12, cost_micros=9), 2, 301),
    ]


def fold(events: list[Event]) -> dict:
    row = new_row("acme", "gen_1")
    for e in events:
        merge(row, e)
    return row


def respects_partition_order(order: tuple[Event, ...]) -> bool:
    """Orders a reader can see: any interleaving of topics, each partition in offset order."""
    last: dict[str, int] = {}
    for e in order:
        if e.offset < last.get(e.topic, -1):
            return False
        last[e.topic] = e.offset
    return True


def test_a_completed_generation_ends_the_same_in_every_order():
    events = completed_generation()
    rows = {repr(sorted(fold(list(order)).items()))
            for order in itertools.permutations(events) if respects_partition_order(order)}
    assert len(rows) == 1
    row = fold(events)
    assert row["status"] == "completed" and row["settled"]
    assert (row["input_tokens"], row["output_tokens"], row["cost_micros"]) == (40, 12, 9)
    assert (row["queued_ms"], row["ttft_ms"], row["duration_ms"], row["finish_reason"]) == (7, 20, 300, "stop")
    assert (row["application_id"], row["model_revision"], row["key_id"]) == ("chat", "tiny@r1", "key_1")
    usage = usage_row(row)
    assert usage["terminal_status"] == "completed" and usage["day"] == "2025-05-01"


def test_a_client_gone_before_a_completion_is_shown_what_it_received_in_every_order():
    """The generation ended inside the disconnect grace, so the API recorded what its client
    had received (`OutputDelivered`) instead of cancelling; the settlement knows nothing of it."""
    events = [*completed_generation(),
              as_event(OutputDelivered(request_id="gen_1", delivered_output_tokens=3), topics.REQUESTS, 1, 400)]
    rows = {repr(sorted(fold(list(order)).items()))
            for order in itertools.permutations(events) if respects_partition_order(order)}
    assert len(rows) == 1
    row = fold(events)
    assert (row["status"], row["output_tokens"], row["delivered_output_tokens"]) == ("completed", 12, 3)
    assert usage_row(row)["delivered_output_tokens"] == 3


def test_a_cancel_that_came_too_late_still_records_what_was_delivered():
    """The API asked to cancel (its client had 4 tokens) just as the generation completed:
    the completion stands, and so does the count on the cancel."""
    events = [*completed_generation(),
              as_event(CancelRequested(request_id="gen_1", reason="client_gone", delivered_output_tokens=4),
                       topics.REQUESTS, 1, 299)]
    row = fold(events)
    assert (row["status"], row["delivered_output_tokens"]) == ("completed", 4)
    # Never more than was generated, and a cancel for another reason says nothing of delivery.
    over = fold([*completed_generation(), as_event(OutputDelivered(request_id="gen_1", delivered_output_tokens=50),
                                                   topics.REQUESTS, 1, 400)])
    assert usage_row(over)["delivered_output_tokens"] == 12
    plain = fold([*completed_generation(), as_event(CancelRequested(request_id="gen_1"), topics.REQUESTS, 1, 299)])
    assert plain["delivered_output_tokens"] is None and usage_row(plain)["delivered_output_tokens"] is None


def test_an_expired_generation_with_a_late_completion_keeps_the_first_terminal_and_the_settlement():
    events = [
        requested(),
        ledger(BudgetReserved(request_id="gen_1", reservation_id="res_1", tokens=140, cost_micros=50,
                              expires_at=T0), 0, 1),
        ledger(ReservationExpired(request_id="gen_1", reservation_id="res_1"), 1, 9000),
        outcome(GenerationFailed(request_id="gen_1", error_code="expired", message="late"), 0, 9000),
        ledger(UsageSettled(request_id="gen_1", reservation_id="res_1", terminal_status="expired",
                            input_tokens=0, output_tokens=0, cost_micros=0), 2, 9001),
        outcome(GenerationCompleted(request_id="gen_1", finish_reason="stop", input_tokens=40, output_tokens=5,
                                    model_revision="tiny@r1", output_sha256="11" * 32, timings=TIMINGS), 1, 9500),
    ]
    rows = {repr(sorted(fold(list(order)).items()))
            for order in itertools.permutations(events) if respects_partition_order(order)}
    assert len(rows) == 1
    row = fold(events)
    assert (row["status"], row["outcome"], row["error_code"]) == ("expired", "failed", "expired")
    assert (row["input_tokens"], row["output_tokens"]) == (0, 0)  # billed as settled, not as the late report


def test_progress_before_the_end():
    events = completed_generation()
    assert fold(events[:1])["status"] == "requested"
    assert fold(events[:3])["status"] == "queued"
    assert fold(events[:4])["status"] == "running"
    assert fold(events[:5])["status"] == "completed" and not fold(events[:5])["settled"]


def test_a_rejection_in_either_order():
    rejected = ledger(GenerationRejected(request_id="gen_1", reason="tokens", message="over"), 0, 2)
    for order in ([requested(), rejected], [rejected, requested()]):
        row = fold(order)
        assert (row["status"], row["reject_reason"], row["settled"]) == ("rejected", "tokens", False)
        assert row["input_tokens"] == 40 and row["model_alias"] == "tiny"


def test_unreadable_records_are_kept_as_bytes_without_a_type():
    event = parse_record(Record(topics.LEDGER.name, 3, 9, "k", b"\xff not json", 0), VERSIONS)
    assert event.type is None and event.value == b"\xff not json" and event.at() is None


def chunk(payload, offset):
    return as_event(payload, topics.BATCHES, offset, offset, corr="batch_1")


def fold_chunk(events):
    row = {c.name: None for c in batch_rules.batch_chunks.columns}
    row.update(status="pending", attempts=0, input_tokens=0, output_tokens=0, cost_micros=0, settled=False)
    return row, [batch_rules.merge_chunk(row, e) for e in events]


def test_a_chunk_reported_twice_keeps_its_first_report_and_settles_once():
    done = dict(batch_id="batch_1", chunk_index=0, part_key="p", completed=10, failed=0, model_revision="r",
                worker_id="w")
    events = [chunk(BatchChunkCompleted(**done, input_tokens=100, output_tokens=50), 0),
              chunk(BatchChunkQueued(batch_id="batch_1", chunk_index=0, reservation_id="r0", tokens=900,
                                     cost_micros=90), 1),
              chunk(BatchChunkCompleted(**done, input_tokens=111, output_tokens=55), 2),
              chunk(BatchUsageSettled(batch_id="batch_1", chunk_index=0, reservation_id="r0", input_tokens=100,
                                      output_tokens=50, cost_micros=30, released_tokens=750,
                                      released_cost_micros=60), 3),
              chunk(BatchUsageSettled(batch_id="batch_1", chunk_index=0, reservation_id="r0", input_tokens=1,
                                      output_tokens=1, cost_micros=1, released_tokens=0, released_cost_micros=0), 4)]
    row, settled = fold_chunk(events)
    assert settled == [False, False, False, True, False]
    assert (row["status"], row["input_tokens"], row["output_tokens"], row["cost_micros"]) == ("completed", 100, 50, 30)
    assert row["reservation_id"] == "r0"


def test_a_generation_answered_from_the_cache_ends_the_same_in_every_order_and_is_marked_in_usage():
    from models.events_generation import CacheHit, ReservationReleased

    events = [
        requested(),
        ledger(BudgetReserved(request_id="gen_1", reservation_id="res_1", tokens=52, cost_micros=0,
                              expires_at=T0 + timedelta(seconds=5)), 0, 1),
        ledger(CacheHit(request_id="gen_1", entry_id="ce_1", model_alias="tiny", model_revision="tiny@r1",
                        similarity=0.97, threshold=0.92, input_tokens=40, saved_output_tokens=12,
                        finish_reason="stop", cost_micros=0), 1, 1),
        ledger(UsageSettled(request_id="gen_1", reservation_id="res_1", terminal_status="completed",
                            input_tokens=40, output_tokens=12, cost_micros=0, cached=True), 2, 1),
        ledger(ReservationReleased(request_id="gen_1", reservation_id="res_1", released_tokens=0,
                                   released_cost_micros=0), 3, 1),
    ]
    rows = {repr(sorted(fold(list(order)).items()))
            for order in itertools.permutations(events) if respects_partition_order(order)}
    assert len(rows) == 1
    row = fold(events)
    assert row["status"] == "completed" and row["cache_entry_id"] == "ce_1" and row["finish_reason"] == "stop"
    assert (row["output_tokens"], row["cost_micros"], row["ttft_ms"]) == (12, 0, 0)
    assert usage_row(row)["cached"] is True and usage_row(fold(completed_generation()))["cached"] is None
