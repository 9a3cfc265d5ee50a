"""The Fleet page's service-level section: the SLO report (`pipelines.projections.slo`,
as `ledgerlm slo report`) over a window the operator picks, read from the projections."""
from __future__ import annotations

from datetime import datetime, timezone

from fastapi import Request

from api.console.auth import ConsoleRefusal
from api.deps import projection_db
from models.prompt_class import PromptThresholds
from pipelines.projections.slo import parse_window, slo_report

WINDOWS = ("15m", "1h", "6h", "24h", "7d")  # offered as links; any other window may be typed in the URL
DEFAULT_WINDOW = "1h"


def slo_section(request: Request, window: str | None) -> dict:
    """The section's context: the report of the generations requested in the window up to now."""
    window = window or DEFAULT_WINDOW
    try:
        span = parse_window(window)
    except ValueError as exc:
        raise ConsoleRefusal(400, str(exc)) from None
    until = datetime.now(timezone.utc)
    thresholds = PromptThresholds.from_settings(request.app.state.services.settings)
    report = slo_report(projection_db(request), since=until - span, until=until, thresholds=thresholds)
    return {"report": report, "window": window, "windows": WINDOWS}
