"""Quota policy: window accounting from ledger facts and the admit/reject decision."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from models.quota import (
    RATE_WINDOW, Admit, Ask, Limits, Reject, TenantUsage, decide, min_service_ms,
)

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ask(tokens_in=10, tokens_out=20, cost=30, **kw) -> Ask:
    return Ask(input_tokens=tokens_in, max_output_tokens=tokens_out, cost_micros=cost, **kw)


def test_unlimited_tenant_is_admitted():
    assert decide(ask(), TenantUsage(), Limits(), T0) == Admit()


def test_oversize_input_and_output_are_refused_without_retry():
    usage = TenantUsage()
    got = decide(ask(tokens_in=101), usage, Limits(max_input_tokens=100), T0)
    assert isinstance(got, Reject) and got.reason == "input_too_large" and got.retry_after_ms is None
    got = decide(ask(tokens_out=65), usage, Limits(max_output_tokens=64), T0)
    assert isinstance(got, Reject) and got.reason == "output_too_large" and got.retry_after_ms is None
    assert decide(ask(tokens_in=100, tokens_out=64), usage, Limits(max_input_tokens=100, max_output_tokens=64), T0).admitted


def test_open_reservations_count_in_full_and_settlement_keeps_only_what_was_used():
    usage = TenantUsage()
    limits = Limits(tokens_per_window=100, window_seconds=60)
    usage.reserve("r1", at(0), 60, 0)
    got = decide(ask(tokens_in=20, tokens_out=30), usage, limits, at(1))
    assert isinstance(got, Reject) and got.reason == "tokens"
    # Held in full until it settles, and what it settles stays a whole window: 61 s at best.
    assert got.retry_after_ms == 61_000 and "in flight hold 60" in got.message
    usage.close("r1", at(2), 25, 0)  # used 25 of 60: the rest is released
    assert decide(ask(tokens_in=20, tokens_out=30), usage, limits, at(3)).admitted


def test_settled_usage_leaves_the_window_and_retry_after_says_when():
    usage = TenantUsage()
    limits = Limits(tokens_per_window=100, window_seconds=60)
    usage.reserve("r1", at(0), 80, 0)
    usage.close("r1", at(10), 80, 0)
    got = decide(ask(tokens_in=10, tokens_out=20), usage, limits, at(30))
    assert isinstance(got, Reject) and got.reason == "tokens"
    # The 80 settled at second 10 leave the 60 s window after second 70: 40 s from now.
    assert 40_000 <= got.retry_after_ms <= 41_000
    assert decide(ask(tokens_in=10, tokens_out=20), usage, limits, at(71)).admitted


def test_retry_after_is_when_the_window_frees_enough_not_a_second():
    """The budget's worth was admitted and settled (or is still in flight): nothing fits
    until the window rolls, and Retry-After says so."""
    limits = Limits(tokens_per_window=100, window_seconds=3600)
    settled, in_flight = TenantUsage(), TenantUsage()
    settled.reserve("r1", at(0), 100, 0)
    settled.close("r1", at(5), 100, 0)
    in_flight.reserve("r1", at(0), 100, 0)
    for usage, low, high in [(settled, 3596_000, 3597_000), (in_flight, 3601_000, 3601_000)]:
        got = decide(ask(tokens_in=10, tokens_out=20), usage, limits, at(10))
        assert isinstance(got, Reject) and got.reason == "tokens" and low <= got.retry_after_ms <= high, got
    # Half settled long ago, half in flight: the settled half leaving is not enough.
    mixed = TenantUsage()
    mixed.reserve("old", at(0), 50, 0)
    mixed.close("old", at(1), 50, 0)
    mixed.reserve("new", at(3000), 50, 0)
    got = decide(ask(tokens_in=30, tokens_out=30), mixed, limits, at(3100))
    assert got.retry_after_ms == 3601_000, "the in-flight 50 would still be in the window"
    got = decide(ask(tokens_in=20, tokens_out=20), mixed, limits, at(3100))
    assert 502_000 <= got.retry_after_ms <= 503_000, "the settled 50 leaving is enough"


def test_a_request_larger_than_the_whole_budget_never_fits():
    got = decide(ask(cost=501), TenantUsage(), Limits(spend_per_window_micros=500), T0)
    assert isinstance(got, Reject) and got.reason == "spend" and got.retry_after_ms is None


def test_spend_budget_counts_cost_not_tokens():
    usage = TenantUsage()
    limits = Limits(spend_per_window_micros=100)
    usage.reserve("r1", T0, 1_000_000, 70)
    assert decide(ask(cost=30), usage, limits, T0).admitted
    got = decide(ask(cost=31), usage, limits, T0)
    assert isinstance(got, Reject) and got.reason == "spend"


def test_rate_limit_counts_admissions_of_the_last_minute():
    usage = TenantUsage()
    limits = Limits(requests_per_minute=2)
    usage.reserve("r1", at(0), 1, 0)
    usage.reserve("r2", at(10), 1, 0)
    got = decide(ask(), usage, limits, at(20))
    assert isinstance(got, Reject) and got.reason == "rate"
    assert got.retry_after_ms == 40_000, "the oldest admission leaves the minute at second 60"
    assert decide(ask(), usage, limits, at(60) + timedelta(milliseconds=1)).admitted


def test_concurrency_counts_open_reservations():
    usage = TenantUsage()
    limits = Limits(max_concurrent=1)
    usage.reserve("r1", T0, 1, 0)
    got = decide(ask(), usage, limits, T0)
    assert isinstance(got, Reject) and got.reason == "concurrency" and got.retry_after_ms > 0
    usage.close("r1", at(1), 1, 0)
    assert decide(ask(), usage, limits, at(1)).admitted


def test_closing_twice_counts_once():
    usage = TenantUsage()
    usage.reserve("r1", T0, 50, 5)
    usage.close("r1", at(1), 40, 4)
    usage.close("r1", at(2), 40, 4)
    used = usage.used(at(3), timedelta(seconds=60))
    assert (used.tokens, used.cost_micros) == (40, 4)


def test_deadline_that_cannot_be_met_is_refused_before_queueing():
    service = min_service_ms(100, queue_ms=200, first_token_ms=10, ms_per_output_token=2)
    assert service == 200 + 10 + 2 * 99
    late = ask(tokens_out=100, deadline_at=at(0.3), min_service_ms=service)
    got = decide(late, TenantUsage(), Limits(), T0)
    assert isinstance(got, Reject) and got.reason == "deadline" and got.retry_after_ms is None
    assert decide(ask(tokens_out=100, deadline_at=at(1), min_service_ms=service), TenantUsage(), Limits(), T0).admitted
    past = decide(ask(deadline_at=at(-1)), TenantUsage(), Limits(), T0)
    assert isinstance(past, Reject) and past.reason == "deadline"


def test_decisions_depend_on_event_times_only():
    """The same facts at the same times decide the same way, however late they are replayed."""
    def replay() -> list:
        usage, out = TenantUsage(), []
        limits = Limits(requests_per_minute=3, tokens_per_window=100, window_seconds=30)
        for i in range(8):
            now = at(i * 7)
            got = decide(ask(tokens_in=5, tokens_out=20), usage, limits, now)
            out.append(got)
            if got.admitted:
                usage.reserve(f"r{i}", now, 25, 0)
                usage.close(f"r{i}", now + timedelta(seconds=3), 25, 0)
        return out

    assert replay() == replay()
    assert any(not d.admitted for d in replay()) and any(d.admitted for d in replay())


def test_rate_window_forgets_old_admissions():
    usage = TenantUsage()
    for i in range(100):
        usage.reserve(f"r{i}", at(i), 1, 0)
    assert all(t > at(99) - RATE_WINDOW for t in usage.admitted_at)
