"""Quota policy as pure functions: what a tenant has used, and whether a request fits.

Usage is built from ledger events only (`BudgetReserved`, `UsageSettled`,
`ReservationExpired`), at their event times, so an admission processor rebuilt from the
log reasons exactly as the one before it. The accounting matches the quotas projection:

- a window of `window_seconds` holds every open reservation in full, plus the tokens and
  spend actually settled inside the window (by settlement time, to the whole second);
- the rate limit counts admitted requests (reservations) in the last 60 s;
- concurrency counts open reservations.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

DEFAULT_WINDOW_S = 3600  # a tenant whose limits name no window (same as the quotas read model)
MAX_WINDOW_S = 7 * 24 * 3600  # settled usage older than this is forgotten
RATE_WINDOW = timedelta(seconds=60)
# Nobody knows when an open reservation will settle; a client told to come back this soon
# finds out cheaply (retrying costs it one rejection).
UNKNOWN_RETRY_MS = 1000

LIMIT_FIELDS = ("requests_per_minute", "max_concurrent", "tokens_per_window", "spend_per_window_micros",
                "window_seconds", "max_input_tokens", "max_output_tokens", "batch_tokens_per_window", "pool",
                "fair_share_weight", "may_send_high")
DEFAULT_FAIR_SHARE_WEIGHT = 1.0
MAX_FAIR_SHARE_WEIGHT = 1000.0  # a ratio of 1000:1 already starves the lighter tenant for all practical use


@dataclass(frozen=True)
class Limits:
    """One tenant's limits; None is unlimited. Built from the latest `TenantLimitsChanged`.

    Two are not ceilings but standing: `fair_share_weight`, the tenant's share of a pool
    worker's tokens against other busy tenants (3.0 gets three times a 1.0 tenant's tokens
    under backlog), and `may_send_high`, whether the tenant may send priority `high`. High
    priority is granted, never assumed: it jumps every normal queue and is the last shed
    when capacity falls, so a tenant has it only once an admin said so. A tenant with no
    limits event, or whose events predate these two fields, has weight 1.0 and no `high`.
    """

    requests_per_minute: int | None = None
    max_concurrent: int | None = None
    tokens_per_window: int | None = None
    spend_per_window_micros: int | None = None
    window_seconds: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    batch_tokens_per_window: int | None = None
    pool: str | None = None
    fair_share_weight: float = DEFAULT_FAIR_SHARE_WEIGHT
    may_send_high: bool = False

    @classmethod
    def from_payload(cls, payload) -> "Limits":
        values = {name: getattr(payload, name, None) for name in LIMIT_FIELDS}
        # Absent on events written before they existed: the defaults apply.
        if values["fair_share_weight"] is None:
            values["fair_share_weight"] = DEFAULT_FAIR_SHARE_WEIGHT
        values["may_send_high"] = bool(values["may_send_high"])
        return cls(**values)

    @property
    def window(self) -> timedelta:
        return timedelta(seconds=min(self.window_seconds or DEFAULT_WINDOW_S, MAX_WINDOW_S))

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in LIMIT_FIELDS}


@dataclass(frozen=True)
class Ask:
    """What one request asks of its tenant's budget."""

    input_tokens: int
    max_output_tokens: int
    cost_micros: int
    deadline_at: datetime | None = None
    min_service_ms: int = 0  # the least time it can take to serve (see `min_service_ms`)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.max_output_tokens


@dataclass(frozen=True)
class Admit:
    admitted: Literal[True] = True


@dataclass(frozen=True)
class Reject:
    reason: str
    message: str
    retry_after_ms: int | None = None
    admitted: Literal[False] = False


@dataclass(frozen=True)
class Charge:
    tokens: int
    cost_micros: int


def _second(at: datetime) -> int:
    return int(at.timestamp())


@dataclass
class TenantUsage:
    """What one tenant holds and has used, as far as its admission processor knows."""

    open: dict[str, Charge] = field(default_factory=dict)  # open reservations by request id
    settled: deque = field(default_factory=deque)  # [second, tokens, cost] in time order
    admitted_at: deque = field(default_factory=deque)  # reservation times, for the rate limit

    def reserve(self, request_id: str, at: datetime, tokens: int, cost_micros: int) -> None:
        self.open[request_id] = Charge(tokens, cost_micros)
        self.admitted_at.append(at)
        self._forget(at)

    def close(self, request_id: str, at: datetime, tokens: int, cost_micros: int) -> None:
        """Ends a reservation, keeping what was actually used. Closing twice does nothing."""
        if self.open.pop(request_id, None) is None:
            return
        second = _second(at)
        if self.settled and self.settled[-1][0] >= second:
            # Settlements may come a little out of time order; fold them into the latest bucket.
            self.settled[-1][1] += tokens
            self.settled[-1][2] += cost_micros
        else:
            self.settled.append([second, tokens, cost_micros])
        self._forget(at)

    def _forget(self, now: datetime) -> None:
        horizon = _second(now) - MAX_WINDOW_S
        while self.settled and self.settled[0][0] <= horizon:
            self.settled.popleft()
        while self.admitted_at and self.admitted_at[0] <= now - RATE_WINDOW:
            self.admitted_at.popleft()

    def _window(self, now: datetime, window: timedelta) -> list:
        start = _second(now) - int(window.total_seconds())
        return [b for b in self.settled if b[0] > start]

    def used(self, now: datetime, window: timedelta) -> Charge:
        buckets = self._window(now, window)
        return Charge(sum(c.tokens for c in self.open.values()) + sum(b[1] for b in buckets),
                      sum(c.cost_micros for c in self.open.values()) + sum(b[2] for b in buckets))

    def requests_last_minute(self, now: datetime) -> list[datetime]:
        return [at for at in self.admitted_at if at > now - RATE_WINDOW]


def min_service_ms(max_output_tokens: int, *, queue_ms: int, first_token_ms: int, ms_per_output_token: float) -> int:
    """The least time a request can take: the recent queue wait, the first token, and each
    further token at the engine's best pace. A lower bound, so a request rejected for its
    deadline could not have made it."""
    return int(queue_ms + first_token_ms + ms_per_output_token * max(0, max_output_tokens - 1))


def _ms(delta: timedelta) -> int:
    return max(1, -(-int(delta.total_seconds() * 1_000_000) // 1000))


def _retry_for_window(usage: TenantUsage, now: datetime, window: timedelta, need: int, limit: int,
                      index: int) -> int | None:
    """When enough usage leaves the window for `need` more to fit, if it ever will,
    counting open reservations in full as the decision does. Settled usage leaves the
    window a window after it settled; what open reservations hold settles now at the
    earliest and then stays a whole window, so when they hold part of the excess it fits
    no sooner than a window from now (sooner only if they settle for less than they hold,
    which the rejection's message says)."""
    if need > limit:
        return None
    used = usage.used(now, window)
    excess = (used.tokens, used.cost_micros)[index] + need - limit
    for bucket in usage._window(now, window):
        excess -= bucket[index + 1]
        if excess <= 0:
            leaves_at = datetime.fromtimestamp(bucket[0], now.tzinfo) + window + timedelta(seconds=1)
            return _ms(leaves_at - now)
    return _ms(window + timedelta(seconds=1))


def _in_flight(usage: TenantUsage, index: int) -> str:
    held = sum((c.tokens, c.cost_micros)[index] for c in usage.open.values())
    return f"; requests in flight hold {held} until they settle" if held else ""


def decide(ask: Ask, usage: TenantUsage, limits: Limits, now: datetime) -> Admit | Reject:
    """Admit, or reject with a reason and when a retry could succeed (None: it never will)."""
    if limits.max_input_tokens is not None and ask.input_tokens > limits.max_input_tokens:
        return Reject("input_too_large", f"{ask.input_tokens} input tokens exceed this tenant's limit of "
                                         f"{limits.max_input_tokens}")
    if limits.max_output_tokens is not None and ask.max_output_tokens > limits.max_output_tokens:
        return Reject("output_too_large", f"max_output_tokens {ask.max_output_tokens} exceeds this tenant's limit "
                                          f"of {limits.max_output_tokens}")
    if ask.deadline_at is not None:
        left_ms = int((ask.deadline_at - now).total_seconds() * 1000)
        if left_ms < ask.min_service_ms:
            return Reject("deadline", f"the deadline leaves {max(left_ms, 0)} ms; serving this request takes at "
                                      f"least {ask.min_service_ms} ms")
    if limits.requests_per_minute is not None:
        recent = usage.requests_last_minute(now)
        if len(recent) >= limits.requests_per_minute:
            oldest = recent[len(recent) - limits.requests_per_minute] if limits.requests_per_minute else now
            return Reject("rate", f"more than {limits.requests_per_minute} requests per minute",
                          _ms(oldest + RATE_WINDOW - now) if limits.requests_per_minute else None)
    if limits.max_concurrent is not None and len(usage.open) >= limits.max_concurrent:
        return Reject("concurrency", f"{len(usage.open)} requests in flight, the limit is {limits.max_concurrent}",
                      UNKNOWN_RETRY_MS if limits.max_concurrent else None)
    window = limits.window
    used = usage.used(now, window)
    if limits.tokens_per_window is not None and used.tokens + ask.tokens > limits.tokens_per_window:
        return Reject("tokens", f"{ask.tokens} tokens do not fit: {used.tokens} of {limits.tokens_per_window} "
                                f"used in the last {int(window.total_seconds())} s{_in_flight(usage, 0)}",
                      _retry_for_window(usage, now, window, ask.tokens, limits.tokens_per_window, 0))
    if limits.spend_per_window_micros is not None and used.cost_micros + ask.cost_micros > limits.spend_per_window_micros:
        return Reject("spend", f"a cost of {ask.cost_micros} micros does not fit: {used.cost_micros} of "
                               f"{limits.spend_per_window_micros} spent in the last {int(window.total_seconds())} s"
                               f"{_in_flight(usage, 1)}",
                      _retry_for_window(usage, now, window, ask.cost_micros, limits.spend_per_window_micros, 1))
    return Admit()
