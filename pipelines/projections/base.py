"""What a projection is, and the light view of a log record that projections read.

Projections read events as plain dicts (the canonical JSON, parsed once per record and
shared by every projection) rather than as pydantic envelopes: validation happened when
the event was appended, and a replay of millions of events cannot afford it twice. An
event of an older schema version is upcast through `models.events.decode` first.
"""
from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from datetime import datetime, timezone
from typing import Any, ClassVar

from sqlalchemy import Connection, Table

from models.events import EventDecodeError, decode, registered_types
from pipelines.eventlog import Record

logger = logging.getLogger(__name__)


class Event:
    """One record of the log: its position, its bytes, and its parsed envelope fields.

    `type` is None when the record is not a readable event; projections other than the
    audit trail skip such records (the audit trail still chains their bytes).
    """

    __slots__ = ("topic", "partition", "offset", "value", "type", "event_id", "tenant_id", "correlation_id",
                 "occurred_at", "payload", "_at")

    def __init__(self, record: Record, data: dict[str, Any] | None):
        self.topic, self.partition, self.offset, self.value = record.topic, record.partition, record.offset, record.value
        self._at = False  # parsed on first use, then kept: several projections ask
        if data is None:
            self.type = self.event_id = self.tenant_id = self.correlation_id = self.occurred_at = None
            self.payload: dict[str, Any] = {}
            return
        self.type: str | None = data.get("event_type")
        self.event_id: str | None = data.get("event_id")
        self.tenant_id: str | None = data.get("tenant_id")
        self.correlation_id: str | None = data.get("correlation_id")
        self.occurred_at: str | None = data.get("occurred_at")
        self.payload = data.get("payload") or {}

    def at(self) -> datetime | None:
        if self._at is False:
            self._at = parse_time(self.occurred_at)
        return self._at

    def __repr__(self) -> str:
        return f"Event({self.type} {self.topic}/{self.partition}@{self.offset})"


def parse_time(value: str | None) -> datetime | None:
    """An ISO timestamp from an event as an aware UTC datetime."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None  # a malformed event must not stop every projection behind it
    return parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed.astimezone(timezone.utc)


def parse_record(record: Record, versions: dict[str, int]) -> Event:
    """`versions`: current schema version per known type (see `schema_versions`)."""
    try:
        data = json.loads(record.value)
    except (UnicodeDecodeError, ValueError):
        logger.warning("unreadable record %s/%s@%s", record.topic, record.partition, record.offset)
        return Event(record, None)
    if not isinstance(data, dict):
        return Event(record, None)
    current = versions.get(data.get("event_type"))
    if current is not None and data.get("schema_version") != current:
        try:
            data = json.loads(decode(record.value).model_dump_json())
        except EventDecodeError as exc:
            logger.warning("undecodable record %s/%s@%s: %s", record.topic, record.partition, record.offset, exc)
            return Event(record, None)
    return Event(record, data)


def schema_versions() -> dict[str, int]:
    return {name: cls.schema_version for name, cls in registered_types().items()}


class Projection(ABC):
    """A read model: its tables, the event types it reads, and how a batch changes its rows.

    `apply` runs inside the runner's transaction, which also stores this projection's
    input positions, so it must only write through `conn` and must not commit. It gets
    each partition's events in offset order; events of different partitions or topics
    come in no promised order, so what it writes must not depend on that order.
    """

    name: ClassVar[str]
    tables: ClassVar[tuple[Table, ...]]
    # Event types it reads; None for all records (the audit trail). Others are skipped,
    # so types added to the catalogue later are ignored until a projection handles them.
    handles: ClassVar[frozenset[str] | None]
    # Topics it reads (names as in `models.topics`); None for every durable topic.
    topics: ClassVar[frozenset[str] | None] = None

    def load(self, conn: Connection) -> None:
        """(Re)reads any state kept between batches; called at start and after a rollback."""

    @abstractmethod
    def apply(self, conn: Connection, events: list[Event]) -> None:
        ...
