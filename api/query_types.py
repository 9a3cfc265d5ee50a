"""Dates and times in query strings: ISO 8601 only. Pydantic would read `0` (or any number)
as a Unix time, so `?since=0` meant 1970; a number here is a mistake, refused with a 400.
A date-time without a zone is UTC."""
from __future__ import annotations

import re
from datetime import date, datetime, timezone
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator

_NUMBER = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")


def _not_a_number(value):
    if isinstance(value, (int, float)) or (isinstance(value, str) and _NUMBER.match(value)):
        raise ValueError("must be an ISO 8601 date or date-time (e.g. 2026-05-01 or 2026-05-01T12:00:00Z), "
                         "not a number")
    return value


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


IsoDate = Annotated[date, BeforeValidator(_not_a_number)]
IsoDateTime = Annotated[datetime, BeforeValidator(_not_a_number), AfterValidator(_utc)]
