"""The SLO report, from the `generations` projection alone, so a replay of the log gives
the same report: per revision and prompt class (`models.prompt_class`, by the prompt's
tokens as requested), p95 time to the first token and p95 time per output token; beside
them, kept apart, the availability of the requests admission admitted and the requests it
rejected, by reason (each per revision and class as well as in all).

What each figure counts, over the generations requested in the window [since, until):

- Latency: completed generations an engine ran (not answered from the semantic cache).
  TTFT is the worker's time to the first token plus the time the work waited after
  admission (`queued_ms + ttft_ms`); the API's `ledgerlm_ttft_seconds` adds the request's
  path to admission. Time per output token is (duration - TTFT) / (output tokens - 1), over
  generations with two output tokens or more. p95 is the nearest rank, as rollouts judge it.
- Availability: completed ÷ admitted requests that ended, leaving out those their own
  client cancelled or walked away from (the platform did not fail them). Failures,
  expiries and cancellations by the deadline or an operator count against it. Requests
  still queued or running are counted apart and in neither side.
- Rejections: requests admission refused, by reason; they are not in availability.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable

from sqlalchemy import Connection, Engine, select

from models.prompt_class import PROMPT_CLASSES, PromptThresholds
from models.tables import generations
from pipelines.projections.generations import utc
from pipelines.rollouts.analysis import p95

CLIENT_CANCELS = frozenset({"client", "client_gone"})  # ends a client chose: not the platform's failure
IN_FLIGHT = frozenset({"queued", "running"})
_WINDOW = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_window(text: str) -> timedelta:
    """'90s', '15m', '1h', '7d' or a number of seconds; a ValueError for anything else."""
    found = _WINDOW.match(text.strip().lower())
    if found is None or float(found.group(1)) <= 0:
        raise ValueError(f"not a window: {text!r} (expected e.g. 90s, 15m, 1h or 7d)")
    return timedelta(seconds=float(found.group(1)) * _UNIT_S[found.group(2)])


@dataclass(frozen=True)
class Latency:
    model_revision: str
    prompt_class: str
    generations: int  # completed engine runs with a first token
    ttft_p95_ms: float | None
    tpot_generations: int  # of those, with two output tokens or more
    tpot_p95_ms: float | None


@dataclass
class Availability:
    model_revision: str  # '' for every revision in the report
    prompt_class: str  # '' for every class (and rows of an unknown prompt length)
    admitted: int = 0
    completed: int = 0
    failed: int = 0
    expired: int = 0
    cancelled: int = 0  # by the deadline or an operator
    cancelled_by_client: int = 0
    in_flight: int = 0

    @property
    def judged(self) -> int:
        """The admitted requests availability is judged over."""
        return self.admitted - self.in_flight - self.cancelled_by_client

    @property
    def availability(self) -> float | None:
        return None if self.judged <= 0 else self.completed / self.judged

    def count(self, status: str, error_code: str | None) -> None:
        self.admitted += 1
        if status in IN_FLIGHT:
            self.in_flight += 1
        elif status == "cancelled":
            if error_code in CLIENT_CANCELS:
                self.cancelled_by_client += 1
            else:
                self.cancelled += 1
        elif status in ("completed", "failed", "expired"):
            setattr(self, status, getattr(self, status) + 1)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "judged": self.judged, "availability": self.availability}


@dataclass(frozen=True)
class Rejections:
    model_revision: str
    prompt_class: str  # '' where the prompt's length is unknown
    reason: str
    count: int


@dataclass
class SloReport:
    since: datetime
    until: datetime
    revision: str | None  # the one revision asked for; None: every revision
    thresholds: PromptThresholds
    latency: list[Latency] = field(default_factory=list)
    availability: list[Availability] = field(default_factory=list)  # per revision and class
    by_revision: list[Availability] = field(default_factory=list)  # per revision, every class
    total: Availability = field(default_factory=lambda: Availability("", ""))
    rejections: list[Rejections] = field(default_factory=list)

    def rejections_by_reason(self) -> dict[str, dict[str, int]]:
        """{reason: {prompt class or '': count, 'all': count}}, the most frequent first."""
        out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for r in self.rejections:
            out[r.reason][r.prompt_class] += r.count
            out[r.reason]["all"] += r.count
        return {reason: dict(counts) for reason, counts in sorted(out.items(), key=lambda kv: (-kv[1]["all"], kv[0]))}

    def as_dict(self) -> dict[str, Any]:
        return {
            "since": self.since.isoformat(), "until": self.until.isoformat(), "revision": self.revision,
            "prompt_classes": {"short_max_tokens": self.thresholds.short_max_tokens,
                               "long_min_tokens": self.thresholds.long_min_tokens},
            "latency": [asdict(x) for x in self.latency],
            "availability": [a.as_dict() for a in self.availability],
            "by_revision": [a.as_dict() for a in self.by_revision], "total": self.total.as_dict(),
            "rejections": [asdict(r) for r in self.rejections],
            "rejections_by_reason": self.rejections_by_reason(),
        }


_COLUMNS = ("model_revision", "prompt_tokens", "status", "reject_reason", "error_code", "cache_entry_id",
            "queued_ms", "ttft_ms", "duration_ms", "output_tokens")
_ORDER = {name: i for i, name in enumerate(PROMPT_CLASSES)}


def _by_class(key: tuple[str, str]) -> tuple[str, int]:
    return key[0], _ORDER.get(key[1], len(_ORDER))


def _latency_of(row) -> tuple[float, float | None] | None:
    """(TTFT ms, time per output token ms or None) of a row the latency figures count."""
    if row["status"] != "completed" or row["cache_entry_id"] is not None or row["ttft_ms"] is None:
        return None
    ttft = (row["queued_ms"] or 0) + row["ttft_ms"]
    out = row["output_tokens"] or 0
    tpot = (max(0, row["duration_ms"] - row["ttft_ms"]) / (out - 1)
            if out > 1 and row["duration_ms"] is not None else None)
    return ttft, tpot


class _Tally:
    """The report's figures as rows are read, two numbers kept per timed generation."""

    def __init__(self, thresholds: PromptThresholds):
        self.thresholds = thresholds
        self.ttfts: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.tpots: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.per_class: dict[tuple[str, str], Availability] = {}
        self.per_revision: dict[str, Availability] = {}
        self.total = Availability("", "")
        self.rejected: dict[tuple[str, str, str], int] = defaultdict(int)

    def add(self, row) -> None:
        rev = row["model_revision"] or ""
        cls = "" if row["prompt_tokens"] is None else self.thresholds.classify(row["prompt_tokens"])
        if row["reject_reason"] is not None:
            self.rejected[(rev, cls, row["reject_reason"])] += 1
            return
        if row["status"] == "requested":  # no decision yet: neither admitted nor rejected
            return
        tallies = [self.per_revision.setdefault(rev, Availability(rev, "")), self.total]
        if cls:
            tallies.append(self.per_class.setdefault((rev, cls), Availability(rev, cls)))
        for tally in tallies:
            tally.count(row["status"], row["error_code"])
        timed = _latency_of(row) if cls else None
        if timed is not None:
            self.ttfts[(rev, cls)].append(timed[0])
            if timed[1] is not None:
                self.tpots[(rev, cls)].append(timed[1])

    def report(self, report: SloReport) -> SloReport:
        report.latency = [Latency(rev, cls, len(self.ttfts[(rev, cls)]), p95(self.ttfts[(rev, cls)]),
                                  len(self.tpots[(rev, cls)]), p95(self.tpots[(rev, cls)]))
                          for rev, cls in sorted(self.ttfts, key=_by_class)]
        report.availability = [self.per_class[k] for k in sorted(self.per_class, key=_by_class)]
        report.by_revision = [self.per_revision[k] for k in sorted(self.per_revision)]
        report.total = self.total
        report.rejections = [Rejections(rev, cls, reason, n) for (rev, cls, reason), n in sorted(self.rejected.items())]
        return report


def summarize(rows: Iterable, *, since: datetime, until: datetime, thresholds: PromptThresholds,
              revision: str | None = None) -> SloReport:
    """The report of `rows` (mappings with `_COLUMNS`), already limited to the window."""
    tally = _Tally(thresholds)
    for row in rows:
        tally.add(row)
    return tally.report(SloReport(since=since, until=until, revision=revision, thresholds=thresholds))


def slo_report(db: Engine | Connection, *, since: datetime, until: datetime, thresholds: PromptThresholds,
               revision: str | None = None, batch_rows: int = 10_000) -> SloReport:
    """The report of the generations requested in [since, until), of one revision or all,
    read in bounded memory per batch (the figures keep two numbers per generation)."""
    g = generations.c
    where = [g.created_at >= utc(since), g.created_at < utc(until)]
    if revision is not None:
        where.append(g.model_revision == revision)
    query = select(*[g[c] for c in _COLUMNS]).where(*where)

    def rows(conn: Connection):
        result = conn.execution_options(stream_results=True, yield_per=batch_rows).execute(query)
        for part in result.partitions(batch_rows):
            yield from (row._mapping for row in part)

    if isinstance(db, Engine):
        with db.connect() as conn:
            return summarize(rows(conn), since=since, until=until, thresholds=thresholds, revision=revision)
    return summarize(rows(db), since=since, until=until, thresholds=thresholds, revision=revision)
