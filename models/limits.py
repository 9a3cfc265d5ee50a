"""The limits catalogue: every limit a tenant can be given, declared once.

Each entry says what the limit is called, its unit, at which level it applies, how it is
checked, and how it is shown. Everything else reads it: the quota policy (`models.quota`:
the `Limits` record and `decide`), who may tighten what (`models.authz`), the admin events
(`models.events_admin`), the quotas projection and its table (`pipelines.projections`,
`models.tables`), the admin routes and CLI (`api.routes.admin`, `api.cli.admin`) and the
console's limits page (`api.console.pages`).

Adding a limit of a kind below is one entry here (with `late` left True: older events must
keep their bytes), a migration adding its column to `tenant_limits` (filled with its
default, as a replay would), and a test of what it does; `tests/unit/test_limits_catalogue.py`
already walks every entry through every reader. A `standing` or `batch` limit also needs
the code that applies it; a new kind of check needs its check in `models.quota` and its
use counted in `pipelines.projections.queries.limits_in_use`.

How a limit is checked (`check`):

- `request`: one request's `measure` (an `Ask` field) against the limit, before anything
  else; a request over it never fits, so it is refused without a retry time;
- `rate`: requests admitted in the last 60 s;
- `concurrency`: requests open (reserved, not yet settled) at once;
- `window`: the `measure` used in the window (`window_seconds`) plus what open
  reservations hold, in full;
- `batch`: batch jobs' tokens per window, which the batch dispatcher accounts apart
  (`models.batch_budget`);
- `window_length`: not a ceiling; the length of the `window` checks' window;
- `standing`: not a ceiling but a standing of the tenant, applied where work is placed
  (`pool`), shared (`fair_share_weight`) or let in (`may_send_high`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

Unit = Literal["requests", "tokens", "micros", "seconds", "weight", "yes_no", "pool"]
Check = Literal["request", "rate", "concurrency", "window", "batch", "window_length", "standing"]
Level = Literal["tenant"]  # every limit is a tenant's today; keys carry scopes, not limits

UNIT_TYPES: dict[str, type] = {"requests": int, "tokens": int, "micros": int, "seconds": int, "weight": float,
                               "yes_no": bool, "pool": str}
CEILINGS = ("request", "rate", "concurrency", "window", "batch")  # the checks that bound use
COLUMN_TYPES = ("int", "bigint", "float", "bool", "name")  # `models.tables` maps each to an SQL type

DEFAULT_WINDOW_S = 3600  # a tenant whose limits name no window
MAX_WINDOW_S = 7 * 24 * 3600  # the longest window; settled usage older than this is forgotten
DEFAULT_FAIR_SHARE_WEIGHT = 1.0
MAX_FAIR_SHARE_WEIGHT = 1000.0  # a ratio of 1000:1 already starves the lighter tenant for all practical use
POOL_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"


@dataclass(frozen=True, eq=False)  # an entry is itself: hashable, compared by identity
class LimitSpec:
    """One limit. `None` as its value is no limit (or, where `default` is set, the default)."""

    name: str
    unit: Unit
    check: Check
    label: str  # how the console names it (the "Bounds" text of a ceiling)
    help: str  # what the CLI's flag says of it
    level: Level = "tenant"
    default: Any = None  # in force while unset; None: no limit
    own: bool = False  # a tenant admin may tighten it for its own tenant (ceilings only)
    # Came after the admin events' first shape: unset, it is left out of their bytes, so
    # events written before it encode as they did. Every limit added from now on is late.
    late: bool = True
    constraints: dict = field(default_factory=dict)  # pydantic Field bounds of a value; ints default to ge=0
    set_max: int | float | None = None  # a bound on what an admin sets that the events do not carry
    column: str | None = None  # the `tenant_limits` column type; default by unit (int: bigint)
    measure: str | None = None  # `request` and `window` checks: the `Ask` field it bounds
    reason: str | None = None  # the rejection reason of admission's check
    refusal: str | None = None  # its message: {asked}, {used}, {limit}, {window_s}, {in_flight}
    unset: str = "not set"  # shown where a standing value is unset

    @property
    def kind(self) -> type:
        return UNIT_TYPES[self.unit]

    @property
    def ceiling(self) -> bool:
        return self.check in CEILINGS

    @property
    def column_type(self) -> str:
        return self.column or {int: "bigint", float: "float", bool: "bool", str: "name"}[self.kind]

    @property
    def bounds(self) -> dict:
        return self.constraints or ({"ge": 0} if self.kind is int else {})

    def normal(self, value):
        """A value as in force: the default where unset, else of the unit's type."""
        return self.default if value is None else self.kind(value)

    def shown(self, value) -> str:
        """A standing value as the console shows it."""
        if self.kind is bool:
            return "yes" if value else "no"
        return self.unset if value is None else str(value)


LIMITS: tuple[LimitSpec, ...] = (
    LimitSpec("requests_per_minute", "requests", "rate", own=True, late=False, column="int",
              label="requests admitted in any 60 s", help="admitted requests per minute",
              reason="rate", refusal="more than {limit} requests per minute"),
    LimitSpec("max_concurrent", "requests", "concurrency", own=True, late=False, column="int",
              label="requests open at once", help="requests in flight at once",
              reason="concurrency", refusal="{used} requests in flight, the limit is {limit}"),
    LimitSpec("tokens_per_window", "tokens", "window", own=True, late=False, measure="tokens",
              label="input and output tokens per window, open reservations counted in full",
              help="input + reserved output tokens per window", reason="tokens",
              refusal="{asked} tokens do not fit: {used} of {limit} used in the last {window_s} s{in_flight}"),
    LimitSpec("spend_per_window_micros", "micros", "window", own=True, late=False, measure="cost_micros",
              label="spend per window, open reservations counted in full",
              help="spend per window, in micro-units of the price", reason="spend",
              refusal="a cost of {asked} micros does not fit: {used} of {limit} spent in the last {window_s} s"
                      "{in_flight}"),
    LimitSpec("window_seconds", "seconds", "window_length", late=False, column="int", constraints={"gt": 0},
              set_max=MAX_WINDOW_S, label="window",
              help=f"length of the token and spend window (default {DEFAULT_WINDOW_S})"),
    LimitSpec("max_input_tokens", "tokens", "request", own=True, late=False, column="int", measure="input_tokens",
              label="input tokens of one request", help="largest prompt, in tokens", reason="input_too_large",
              refusal="{asked} input tokens exceed this tenant's limit of {limit}"),
    LimitSpec("max_output_tokens", "tokens", "request", own=True, late=False, column="int",
              measure="max_output_tokens", label="output tokens one request may ask for",
              help="largest max_output_tokens", reason="output_too_large",
              refusal="max_output_tokens {asked} exceeds this tenant's limit of {limit}"),
    LimitSpec("batch_tokens_per_window", "tokens", "batch", own=True, late=False,
              label="batch tokens per window", help="tokens per window for batch jobs"),
    LimitSpec("pool", "pool", "standing", late=False, constraints={"pattern": POOL_PATTERN}, unset="shared",
              label="Pool", help="dedicated pool name ('interactive' for the shared pool)"),
    LimitSpec("fair_share_weight", "weight", "standing", default=DEFAULT_FAIR_SHARE_WEIGHT,
              constraints={"gt": 0, "le": MAX_FAIR_SHARE_WEIGHT}, label="Fair-share weight",
              help="share of a pool worker's tokens against other busy tenants (default 1.0)"),
    LimitSpec("may_send_high", "yes_no", "standing", default=False, label="May send priority high",
              help="whether the tenant may send priority high: yes or no (default no)"),
)

BY_NAME: dict[str, LimitSpec] = {spec.name: spec for spec in LIMITS}
LIMIT_FIELDS: tuple[str, ...] = tuple(BY_NAME)
OWN_LIMIT_FIELDS: tuple[str, ...] = tuple(spec.name for spec in LIMITS if spec.own)


def checked_by(*checks: str) -> tuple[LimitSpec, ...]:
    """The limits checked so, in catalogue order."""
    return tuple(spec for spec in LIMITS if spec.check in checks)


def event_field(spec: LimitSpec) -> tuple[Any, Any]:
    """The limit as an admin event's field: None unset, and left out of the bytes if late."""
    extra = {"exclude_if": _is_none} if spec.late else {}
    return spec.kind | None, Field(default=None, **spec.bounds, **extra)


def body_field(spec: LimitSpec) -> tuple[Any, Any]:
    """The limit as a field of the admin route's body: what an admin may send."""
    bounds = {**spec.bounds, **({"le": spec.set_max} if spec.set_max is not None else {})}
    return spec.kind | None, Field(default=None, **bounds)


def _is_none(value) -> bool:
    return value is None


def _validate(limits: tuple[LimitSpec, ...]) -> None:
    """A malformed entry fails at import, not when a reader first meets it."""
    if len({spec.name for spec in limits}) != len(limits):
        raise ValueError("a limit is declared twice")
    for spec in limits:
        if spec.unit not in UNIT_TYPES or spec.check not in CEILINGS + ("window_length", "standing"):
            raise ValueError(f"limit {spec.name}: unknown unit {spec.unit!r} or check {spec.check!r}")
        wrong = []
        if spec.column_type not in COLUMN_TYPES:
            wrong.append(f"column {spec.column_type!r}")
        if spec.own and not (spec.ceiling and spec.kind is int):
            wrong.append("only a ceiling can be tightened by the tenant's own limits")
        if spec.check in ("request", "window") and not spec.measure:
            wrong.append("a request or window check names its measure")
        if spec.check == "window" and spec.measure not in ("tokens", "cost_micros"):
            wrong.append("a window holds tokens and cost_micros only")
        if spec.check in ("request", "rate", "concurrency", "window") and not (spec.reason and spec.refusal):
            wrong.append("admission's check needs a reason and a refusal")
        if wrong:
            raise ValueError(f"limit {spec.name}: {'; '.join(wrong)}")


_validate(LIMITS)
