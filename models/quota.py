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
from dataclasses import dataclass, field, make_dataclass
from datetime import datetime, timedelta
from typing import Literal

from models.limits import DEFAULT_WINDOW_S, LIMIT_FIELDS, LIMITS, MAX_WINDOW_S, LimitSpec, checked_by

RATE_WINDOW = timedelta(seconds=60)
# Nobody knows when an open reservation will settle; a client told to come back this soon
# finds out cheaply (retrying costs it one rejection).
UNKNOWN_RETRY_MS = 1000


class _LimitsBase:
    """One tenant's limits, a field per entry of the catalogue (`models.limits.LIMITS`);
    None is unlimited. Built from the latest `TenantLimitsChanged`.

    Some are not ceilings but standing: `fair_share_weight`, the tenant's share of a pool
    worker's tokens against other busy tenants (3.0 gets three times a 1.0 tenant's tokens
    under backlog), and `may_send_high`, whether the tenant may send priority `high`. High
    priority is granted, never assumed: it jumps every normal queue and is the last shed
    when capacity falls, so a tenant has it only once an admin said so. A tenant with no
    limits event, or whose events predate a limit, has that limit's default (weight 1.0,
    no `high`).
    """

    @classmethod
    def from_payload(cls, payload) -> "Limits":
        # Absent on events written before they existed: the defaults apply.
        return cls(**{spec.name: spec.normal(getattr(payload, spec.name, None)) for spec in LIMITS})

    @property
    def window(self) -> timedelta:
        return timedelta(seconds=min(self.window_seconds or DEFAULT_WINDOW_S, MAX_WINDOW_S))

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in LIMIT_FIELDS}


Limits = make_dataclass("Limits", [(spec.name, spec.kind | None if spec.default is None else spec.kind,
                                    field(default=spec.default)) for spec in LIMITS],
                        bases=(_LimitsBase,), frozen=True)
Limits.__module__ = __name__
Limits.__doc__ = _LimitsBase.__doc__


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


@dataclass
class _Use:
    """A tenant's use at one moment, as the checks of one decision ask for it."""

    usage: TenantUsage
    now: datetime
    window: timedelta
    _used: Charge | None = None

    @property
    def used(self) -> Charge:  # summed once per decision, and only if a window check asks
        if self._used is None:
            self._used = self.usage.used(self.now, self.window)
        return self._used


def _check_request(spec: LimitSpec, limit: int, ask: Ask, use: _Use) -> Reject | None:
    asked = getattr(ask, spec.measure)
    if asked > limit:
        return Reject(spec.reason, spec.refusal.format(asked=asked, limit=limit))
    return None


def _check_rate(spec: LimitSpec, limit: int, ask: Ask, use: _Use) -> Reject | None:
    recent = use.usage.requests_last_minute(use.now)
    if len(recent) < limit:
        return None
    retry = _ms(recent[len(recent) - limit] + RATE_WINDOW - use.now) if limit else None
    return Reject(spec.reason, spec.refusal.format(limit=limit, used=len(recent)), retry)


def _check_concurrency(spec: LimitSpec, limit: int, ask: Ask, use: _Use) -> Reject | None:
    held = len(use.usage.open)
    if held < limit:
        return None
    return Reject(spec.reason, spec.refusal.format(limit=limit, used=held), UNKNOWN_RETRY_MS if limit else None)


def _check_window(spec: LimitSpec, limit: int, ask: Ask, use: _Use) -> Reject | None:
    index = ("tokens", "cost_micros").index(spec.measure)
    asked, used = getattr(ask, spec.measure), getattr(use.used, spec.measure)
    if used + asked <= limit:
        return None
    return Reject(spec.reason, spec.refusal.format(asked=asked, used=used, limit=limit,
                                                   window_s=int(use.window.total_seconds()),
                                                   in_flight=_in_flight(use.usage, index)),
                  _retry_for_window(use.usage, use.now, use.window, asked, limit, index))


# How admission checks each kind of limit (`models.limits`): a request's own size first (it
# never fits, whatever the tenant's use), then, after the deadline, the tenant's use.
REQUEST_CHECKS = {"request": _check_request}
USE_CHECKS = {"rate": _check_rate, "concurrency": _check_concurrency, "window": _check_window}
# The other kinds are applied elsewhere: batch budgets by the batch dispatcher
# (`models.batch_budget`), the window's length by the window checks here, and standings by
# admission's placement, the workers' fair share and the priority gate.
APPLIED_ELSEWHERE = ("batch", "window_length", "standing")
_REQUEST_SPECS, _USE_SPECS = checked_by(*REQUEST_CHECKS), checked_by(*USE_CHECKS)


def _first_refusal(specs: tuple[LimitSpec, ...], checks: dict, ask: Ask, limits: Limits, use: _Use) -> Reject | None:
    for spec in specs:
        limit = getattr(limits, spec.name)
        if limit is not None and (refused := checks[spec.check](spec, limit, ask, use)):
            return refused
    return None


def decide(ask: Ask, usage: TenantUsage, limits: Limits, now: datetime) -> Admit | Reject:
    """Admit, or reject with a reason and when a retry could succeed (None: it never will)."""
    use = _Use(usage, now, limits.window)
    if refused := _first_refusal(_REQUEST_SPECS, REQUEST_CHECKS, ask, limits, use):
        return refused
    if ask.deadline_at is not None:
        left_ms = int((ask.deadline_at - now).total_seconds() * 1000)
        if left_ms < ask.min_service_ms:
            return Reject("deadline", f"the deadline leaves {max(left_ms, 0)} ms; serving this request takes at "
                                      f"least {ask.min_service_ms} ms")
    return _first_refusal(_USE_SPECS, USE_CHECKS, ask, limits, use) or Admit()
