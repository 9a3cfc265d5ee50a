"""Admission handlers: decisions from limits, settlement exactly once on every path,
expiry of lost work, and a book rebuilt from the ledger deciding as the original did."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from models import topics
from models.events import new_event
from models.events_admin import ModelAliasSet, ModelRevisionApproved, TenantCreated, TenantLimitsChanged
from models.events_generation import (
    GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationRequested, Position, Timings,
)
from models.registry import Registry
from models.reservations import ReservationBook
from pipelines.admission.processor import ServiceEstimate, expire_overdue, handle_requested, handle_terminal

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
GRACE = timedelta(seconds=5)
REV = "tiny@abc"


def registry(**limits) -> Registry:
    reg = Registry()
    for payload in (TenantCreated(tenant_id="acme", name="Acme", actor="t"),
                    ModelRevisionApproved(model_revision=REV, model_path="/m", engine_config_hash="abc",
                                          max_model_len=512, price_input_per_1k_micros=1000,
                                          price_output_per_1k_micros=2000, actor="t"),
                    ModelAliasSet(alias="tiny", model_revision=REV, actor="t")):
        reg.apply(new_event(payload, tenant_id="acme", correlation_id="admin"))
    if limits:
        reg.apply(new_event(TenantLimitsChanged(tenant_id="acme", actor="t", **limits),
                            tenant_id="acme", correlation_id="admin"))
    return reg


def requested(request_id: str, *, at: datetime = T0, input_tokens=10, max_output_tokens=20, deadline_s=60.0,
              priority="normal"):
    req = GenerationRequested(
        request_id=request_id, model_alias="tiny", model_revision=REV, input_tokens=input_tokens,
        input_sha256="0" * 64, max_output_tokens=max_output_tokens, priority=priority,
        deadline_at=at + timedelta(seconds=deadline_s), prompt_ref=Position(topic="p", partition=0, offset=0))
    return new_event(req, tenant_id="acme", correlation_id=request_id, occurred_at=at)


def completed(request_id: str, *, input_tokens=10, output_tokens=20):
    return new_event(GenerationCompleted(request_id=request_id, finish_reason="length", input_tokens=input_tokens,
                                         output_tokens=output_tokens, model_revision=REV, output_sha256="x",
                                         timings=Timings()), tenant_id="acme", correlation_id=request_id)


def types(outputs) -> list[tuple[str, str]]:
    return [(topic.name, env.event_type) for topic, env in outputs]


def test_admitted_request_is_reserved_and_queued_by_priority():
    book = ReservationBook()
    out = handle_requested(requested("r1", priority="high"), registry=registry(may_send_high=True), book=book, now=T0,
                           grace=GRACE)
    assert types(out) == [(topics.LEDGER.name, "BudgetReserved"), (topics.LEDGER.name, "GenerationAdmitted"),
                          (topics.work_topic(None, "high", REV).name, "GenerationQueued")]
    reserved = out[0][1].payload
    assert reserved.tokens == 30 and reserved.cost_micros == 10 + 40
    assert reserved.expires_at == T0 + timedelta(seconds=60) + GRACE
    assert handle_requested(requested("r1"), registry=registry(), book=book, now=T0, grace=GRACE) == [], \
        "a redelivered request is decided once"


def test_dedicated_pool_routes_to_its_own_work_topic():
    out = handle_requested(requested("r1"), registry=registry(pool="gold"), book=ReservationBook(), now=T0,
                           grace=GRACE)
    assert out[2][0] == topics.work_topic("gold", "normal", REV) != topics.work_topic(None, "normal", REV)


def test_work_waits_on_its_pinned_revisions_own_topic():
    queued_on = {topic.name for topic, env in handle_requested(requested("r1"), registry=registry(),
                                                               book=ReservationBook(), now=T0, grace=GRACE)
                 if env.event_type == "GenerationQueued"}
    assert queued_on == {topics.work_topic(None, "normal", REV).name}
    assert topics.work_topic(None, "normal", REV) != topics.work_topic(None, "normal", REV + "-other")
    assert topics.WORK_NORMAL.name not in queued_on, "no revision-less topic: any worker would take it"


def test_rejection_goes_to_ledger_and_stream_with_retry_after():
    book = ReservationBook()
    reg = registry(max_concurrent=1)
    handle_requested(requested("r1"), registry=reg, book=book, now=T0, grace=GRACE)
    out = handle_requested(requested("r2"), registry=reg, book=book, now=T0, grace=GRACE)
    assert types(out) == [(topics.LEDGER.name, "GenerationRejected"), (topics.STREAM.name, "GenerationRejected")]
    rejected = out[0][1].payload
    assert rejected.reason == "concurrency" and rejected.retry_after_ms > 0
    assert handle_requested(requested("r2"), registry=reg, book=book, now=T0, grace=GRACE) == []


def test_unknown_revision_and_hopeless_deadline_are_rejected():
    out = handle_requested(requested("r1", deadline_s=0.001, max_output_tokens=200), registry=registry(),
                           book=ReservationBook(), now=T0, grace=GRACE,
                           estimate=ServiceEstimate(first_token_ms=5, ms_per_output_token=1))
    assert out[0][1].payload.reason == "deadline"
    reg = registry()
    reg.revisions.clear()
    assert handle_requested(requested("r2"), registry=reg, book=ReservationBook(), now=T0,
                            grace=GRACE)[0][1].payload.reason == "unknown_model"


def test_spend_budget_is_never_overrun_by_a_burst():
    reg, book = registry(spend_per_window_micros=50 * 10), ReservationBook()
    admitted = 0
    for i in range(40):
        out = handle_requested(requested(f"r{i}"), registry=reg, book=book, now=T0, grace=GRACE)
        admitted += out[0][1].event_type == "BudgetReserved"
    assert admitted == 10
    assert sum(r.cost_micros for r in book.open.values()) <= 500


def test_every_terminal_path_settles_once_and_releases_the_rest():
    reg, book = registry(), ReservationBook()
    for rid in ("done", "cut", "broke"):
        handle_requested(requested(rid), registry=reg, book=book, now=T0, grace=GRACE)
    ends = {
        "done": completed("done", output_tokens=20),
        "cut": new_event(GenerationCancelled(request_id="cut", reason="client_gone", input_tokens=10, output_tokens=3),
                         tenant_id="acme", correlation_id="cut"),
        "broke": new_event(GenerationFailed(request_id="broke", error_code="engine_error", message="x",
                                            input_tokens=10), tenant_id="acme", correlation_id="broke"),
    }
    expected = {"done": ("completed", 30, 0), "cut": ("cancelled", 13, 17), "broke": ("failed", 10, 20)}
    for rid, env in ends.items():
        out = handle_terminal(env, registry=reg, book=book)
        settled, released = out[0][1].payload, out[1][1].payload
        status, used, freed = expected[rid]
        assert (settled.terminal_status, settled.input_tokens + settled.output_tokens, released.released_tokens) \
            == (status, used, freed)
        assert handle_terminal(env, registry=reg, book=book) == [], "a repeated terminal settles nothing"
    assert not book.open


def test_work_is_judged_overdue_as_of_the_last_complete_read_so_an_end_waiting_to_be_read_settles_it():
    reg, book = registry(), ReservationBook()
    handle_requested(requested("held", deadline_s=10), registry=reg, book=book, now=T0, grace=GRACE)
    # Admission was held up (a failover): the wall clock is past deadline + grace, but it has
    # read its input only to 12 s. The end written meanwhile settles it, at its usage.
    assert expire_overdue(book=book, now=T0 + timedelta(seconds=40), read_to=T0 + timedelta(seconds=12)) == []
    out = handle_terminal(completed("held", output_tokens=4), registry=reg, book=book)
    assert out[0][1].payload.terminal_status == "completed" and out[0][1].payload.output_tokens == 4
    assert expire_overdue(book=book, now=T0 + timedelta(seconds=60), read_to=T0 + timedelta(seconds=60)) == []


def test_lost_work_expires_at_deadline_plus_grace_and_a_late_terminal_is_ignored():
    reg, book = registry(), ReservationBook()
    handle_requested(requested("lost", deadline_s=10), registry=reg, book=book, now=T0, grace=GRACE)
    assert expire_overdue(book=book, now=T0 + timedelta(seconds=14)) == []
    out = expire_overdue(book=book, now=T0 + timedelta(seconds=15))
    assert types(out) == [(topics.LEDGER.name, "ReservationExpired"), (topics.OUTCOMES.name, "GenerationFailed"),
                          (topics.STREAM.name, "GenerationFailed"), (topics.LEDGER.name, "UsageSettled"),
                          (topics.LEDGER.name, "ReservationReleased")]
    assert out[1][1].payload.error_code == "expired"
    assert out[3][1].payload.terminal_status == "expired" and out[4][1].payload.released_tokens == 30
    assert expire_overdue(book=book, now=T0 + timedelta(seconds=60)) == []
    assert handle_terminal(completed("lost"), registry=reg, book=book) == []
    assert handle_terminal(out[1][1], registry=reg, book=book) == [], "its own expiry notice settles nothing"


def test_only_due_reservations_are_expired_earliest_first_and_closed_ones_never():
    reg, book = registry(), ReservationBook()
    for name, deadline_s in (("late", 30), ("early", 10), ("middle", 20), ("settled", 5)):
        handle_requested(requested(name, deadline_s=deadline_s), registry=reg, book=book, now=T0, grace=GRACE)
    handle_terminal(completed("settled", output_tokens=3), registry=reg, book=book)
    assert book.expired(T0 + timedelta(seconds=14)) == []
    due = book.expired(T0 + timedelta(seconds=25))
    assert [r.request_id for r in due] == ["early", "middle"]
    # Not yet closed: found again; once its expiry is applied, never.
    assert [r.request_id for r in book.expired(T0 + timedelta(seconds=25))] == ["early", "middle"]
    out = expire_overdue(book=book, now=T0 + timedelta(seconds=25))
    assert sorted(env.correlation_id for _, env in out if env.event_type == "ReservationExpired") == ["early", "middle"]
    assert book.expired(T0 + timedelta(seconds=34)) == []
    assert [r.request_id for r in book.expired(T0 + timedelta(seconds=35))] == ["late"]


def test_deadline_passed_in_the_queue_settles_as_expired():
    reg, book = registry(), ReservationBook()
    handle_requested(requested("slow"), registry=reg, book=book, now=T0, grace=GRACE)
    env = new_event(GenerationFailed(request_id="slow", error_code="deadline_expired", message="queue"),
                    tenant_id="acme", correlation_id="slow")
    assert handle_terminal(env, registry=reg, book=book)[0][1].payload.terminal_status == "expired"


def test_a_book_rebuilt_from_the_ledger_decides_as_the_original():
    reg = registry(requests_per_minute=5, tokens_per_window=200, window_seconds=60, max_concurrent=3)
    original, ledger = ReservationBook(), []

    def step(book, i, log=None):
        now = T0 + timedelta(seconds=i * 4)
        out = handle_requested(requested(f"r{i}", at=now), registry=reg, book=book, now=now, grace=GRACE)
        if i % 2 and out and out[0][1].event_type == "BudgetReserved":
            out += handle_terminal(completed(f"r{i}", output_tokens=5), registry=reg, book=book)
        if log is not None:
            log += [env for topic, env in out if topic == topics.LEDGER]
        return [(env.event_type, getattr(env.payload, "reason", None)) for _, env in out]

    first = [step(original, i, ledger) for i in range(12)]
    rebuilt = ReservationBook()
    for env in ledger:
        rebuilt.apply(env)
    assert set(rebuilt.open) == set(original.open)
    assert [step(rebuilt, i) for i in range(12, 20)] == [step(original, i) for i in range(12, 20)]
    assert any(kind == "GenerationRejected" for steps in first for kind, _ in steps)


def cache_hit(request_id: str, *, output_tokens=12, **kw):
    from models.events_generation import CacheRef

    env = requested(request_id, **kw)
    ref = CacheRef(entry_id="ce_1", source_request_id="r0", similarity=0.97, threshold=0.92,
                   output_tokens=output_tokens, finish_reason="stop")
    return env.model_copy(update={"payload": env.payload.model_copy(update={"cache": ref})})


def test_a_cache_hit_is_settled_at_once_at_the_tenant_s_cache_price_and_nothing_is_queued():
    from models.events_admin import CachePolicySet

    reg, book = registry(), ReservationBook()
    out = handle_requested(cache_hit("r1"), registry=reg, book=book, now=T0, grace=GRACE)
    assert types(out) == [(topics.LEDGER.name, "BudgetReserved"), (topics.LEDGER.name, "CacheHit"),
                          (topics.STREAM.name, "CacheHit"), (topics.LEDGER.name, "UsageSettled"),
                          (topics.LEDGER.name, "ReservationReleased")]
    settled = out[3][1].payload
    assert settled.cached and settled.cost_micros == 0 and settled.output_tokens == 12, "free by default"
    assert not book.open and book.decided("r1"), "no reservation outlives the decision"
    assert handle_requested(cache_hit("r1"), registry=reg, book=book, now=T0, grace=GRACE) == []

    reg.apply(new_event(CachePolicySet(tenant_id="acme", model_alias="tiny", enabled=True,
                                       price_output_per_1k_micros=500, actor="t"), tenant_id="acme",
                        correlation_id="admin"))
    out = handle_requested(cache_hit("r2", output_tokens=3), registry=reg, book=book, now=T0, grace=GRACE)
    hit = next(env.payload for _, env in out if env.event_type == "CacheHit")
    assert hit.cost_micros == 2 and out[3][1].payload.cost_micros == 2, "3 tokens at 500 a thousand, rounded up"
    assert hit.saved_output_tokens == 3 and hit.entry_id == "ce_1" and hit.similarity == 0.97


def test_a_cache_hit_meets_the_tenant_s_limits_like_any_request():
    reg, book = registry(requests_per_minute=2), ReservationBook()
    decided = [handle_requested(cache_hit(f"r{i}"), registry=reg, book=book, now=T0, grace=GRACE)[0][1]
               for i in range(3)]
    assert [e.event_type for e in decided] == ["BudgetReserved", "BudgetReserved", "GenerationRejected"]
    assert decided[2].payload.reason == "rate"
    reg.suspended["acme"] = "unpaid"
    assert handle_requested(cache_hit("r9"), registry=reg, book=ReservationBook(), now=T0,
                            grace=GRACE)[0][1].payload.reason == "tenant_disabled"
