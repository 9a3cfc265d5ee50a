"""The eval table: per task and revision, a quality score in [0, 1] that an operator
uploads (from an offline eval run) as one admin event, `EvalScoresRecorded`.

Rollouts gate on it (`Guardrails.max_eval_score_drop`: a candidate may score at most that
much below stable on any task stable has a score for), and the registry keeps each task
and revision's latest row, so every process reads the same table.

A table file is CSV with a header naming `task`, `model_revision`, `score` and optionally
`samples`, or JSON lines with those keys.
"""
from __future__ import annotations

import csv
import io
import json

from pydantic import ValidationError

from models.events import Envelope
from models.events_admin import EvalRow, EvalScoresRecorded
from models.registry import Registry
from pipelines.admin.commands import PLATFORM, AdminError, AdminNotFound, RegistryView, _admin_event, _append

COLUMNS = ("task", "model_revision", "score", "samples")


def parse_table(text: str) -> list[dict]:
    """The rows of a CSV (with a header) or JSON-lines table, as dicts; `AdminError` naming
    the line of the first one that is neither."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise AdminError("the eval table is empty")
    if lines[0].lstrip().startswith("{"):
        rows = []
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise AdminError(f"line {number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise AdminError(f"line {number}: a row is a JSON object")
            rows.append(row)
        return rows
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    missing = {"task", "model_revision", "score"} - set(reader.fieldnames or ())
    if missing:
        raise AdminError(f"the CSV header lacks {sorted(missing)} (columns: {', '.join(COLUMNS)})")
    return [{k: v for k, v in row.items() if k in COLUMNS and v not in (None, "")} for row in reader]


def record(view: RegistryView, *, rows: list[dict], source: str, actor: str) -> Envelope:
    """Appends the rows as one event, or nothing: every row must be valid, name an approved
    revision, and appear once."""
    registry = view.refresh()
    try:
        parsed = [EvalRow(**row) for row in rows]
        payload = EvalScoresRecorded(source=source, rows=tuple(parsed), actor=actor)
    except ValidationError as exc:
        raise AdminError("; ".join(f"{'.'.join(map(str, e['loc'])) or 'eval table'}: {e['msg']}"
                                   for e in exc.errors(include_url=False))) from None
    except TypeError as exc:
        raise AdminError(f"eval table: {exc}") from None
    seen = set()
    for number, row in enumerate(parsed, 1):
        if row.model_revision not in registry.revisions:
            raise AdminNotFound(f"row {number}: model revision {row.model_revision!r} is not approved")
        if (row.task, row.model_revision) in seen:
            raise AdminError(f"row {number}: task {row.task!r} and revision {row.model_revision!r} appear twice")
        seen.add((row.task, row.model_revision))
    env = _admin_event(payload, PLATFORM)
    _append(view._log, env)
    return env


def table(registry: Registry, *, task: str | None = None, model_revision: str | None = None) -> list[dict]:
    return [{"task": t, "model_revision": rev, "score": s.score, "samples": s.samples, "source": s.source,
             "recorded_at": s.recorded_at.isoformat()}
            for t, by_revision in sorted(registry.evals.items()) if task in (None, t)
            for rev, s in sorted(by_revision.items()) if model_revision in (None, rev)]


def compared(registry: Registry, stable: str, candidate: str) -> dict[str, tuple[float, float | None]]:
    """{task: (stable's score, the candidate's or None)} for every task stable has a score for."""
    return {task: (by_revision[stable].score, by_revision[candidate].score if candidate in by_revision else None)
            for task, by_revision in sorted(registry.evals.items()) if stable in by_revision}
