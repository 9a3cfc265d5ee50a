"""What an API process knows of recent generations, read from the durable topics.

Read on demand, never in the background: a lookup for a tenant first reads that tenant's
partitions of the requests, ledger and outcomes topics up to their current end, so it
sees every event appended before the call, by any replica (read-your-writes). Status
rows are folded with the generations projection's own `merge`, so they say what the
projection will say; the projection (SQL) answers for anything older than `window`.
Memory is one small row per generation of the window.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

from models import topics
from models.topics import Topic
from pipelines.eventlog import EventLog, partition_for
from pipelines.idempotency import WINDOW as IDEMPOTENCY_WINDOW, Claim
from pipelines.projections.base import Event, parse_record, parse_time, schema_versions
from pipelines.projections.generations import TYPES as STATUS_TYPES, merge, new_row

STATUS_TOPICS = (topics.REQUESTS, topics.LEDGER, topics.OUTCOMES)


@dataclass(frozen=True)
class RequestInfo:
    """A generation as its `GenerationRequested` put it."""

    tenant_id: str
    request_id: str
    route: str
    model_alias: str
    stream_offset: int
    request_sha256: str | None
    idempotency_key_sha256: str | None
    deadline_at: datetime | None
    at: datetime
    offset: int  # of the GenerationRequested in the tenant's requests partition


class RequestIndex:
    def __init__(self, log: EventLog, *, window: timedelta = IDEMPOTENCY_WINDOW + timedelta(hours=1)):
        self._log = log
        self._window = window
        self._versions = schema_versions()
        self._lock = threading.Lock()
        self._next: dict[tuple[str, int], int] = {}
        self._requests: dict[tuple[str, str], RequestInfo] = {}
        self._claims: dict[tuple[str, str], Claim] = {}
        self._rows: dict[tuple[str, str], dict[str, Any]] = {}

    # -- lookups (each reads the tenant's partitions first) -------------------------------

    def request(self, tenant_id: str, request_id: str) -> RequestInfo | None:
        self.catch_up(tenant_id, (topics.REQUESTS,))
        return self._requests.get((tenant_id, request_id))

    def claim(self, tenant_id: str, key_sha256: str, *, up_to: int | None = None) -> Claim | None:
        """The live claim of a key; `up_to`: read at least to this requests offset first."""
        self.catch_up(tenant_id, (topics.REQUESTS,), at_least=up_to)
        return self._claims.get((tenant_id, key_sha256))

    def status(self, tenant_id: str, request_id: str) -> dict[str, Any] | None:
        self.catch_up(tenant_id, STATUS_TOPICS)
        key = (tenant_id, request_id)
        if key not in self._requests:
            return None  # ledger or outcome events alone: a request older than the window
        row = self._rows.get(key)
        return dict(row) if row else None

    # -- reading -----------------------------------------------------------------------

    def catch_up(self, tenant_id: str, which: Iterable[Topic], *, at_least: int | None = None) -> None:
        for topic in which:
            partition = partition_for(tenant_id, self._log.partitions(topic.name))
            with self._lock:
                self._read(topic.name, partition, at_least if topic is topics.REQUESTS else None)

    def _read(self, topic: str, partition: int, at_least: int | None) -> None:
        tp = (topic, partition)
        if tp not in self._next:
            self._next[tp] = self._first_recent(topic, partition)
        end = self._log.end_offset(topic, partition)
        if at_least is not None:
            end = max(end, at_least + 1)
        while self._next[tp] < end:
            batch = self._log.read(topic, partition, self._next[tp], max_records=1000,
                                   timeout_s=0.0 if at_least is None else 5.0)
            if not batch:
                return
            for record in batch:
                self._fold(parse_record(record, self._versions))
            self._next[tp] = batch[-1].offset + 1

    def _first_recent(self, topic: str, partition: int) -> int:
        """The first offset stamped within the window: a binary search over timestamps,
        which producers stamp in offset order up to clock skew (the window allows an hour)."""
        cutoff_ms = int((datetime.now(timezone.utc) - self._window).timestamp() * 1000)
        hi = self._log.end_offset(topic, partition)
        first = self._log.read(topic, partition, 0, max_records=1)
        if not first or first[0].timestamp_ms >= cutoff_ms:
            return first[0].offset if first else hi
        lo = first[0].offset + 1
        while lo < hi:
            mid = (lo + hi) // 2
            found = self._log.read(topic, partition, mid, max_records=1)
            if not found or found[0].offset >= hi or found[0].timestamp_ms >= cutoff_ms:
                hi = mid
            else:
                lo = found[0].offset + 1
        return lo

    def _fold(self, e: Event) -> None:
        if e.type not in STATUS_TYPES or not e.tenant_id:
            return
        request_id = e.payload.get("request_id") or e.correlation_id
        key = (e.tenant_id, request_id)
        if e.type == "GenerationRequested":
            self._remember(e, request_id)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = new_row(e.tenant_id, request_id)
        merge(row, e)

    def _remember(self, e: Event, request_id: str) -> None:
        p, at = e.payload, e.at() or datetime.now(timezone.utc)
        if (e.tenant_id, request_id) not in self._requests:  # the first request of an id is the one decided
            self._requests[(e.tenant_id, request_id)] = RequestInfo(
                tenant_id=e.tenant_id, request_id=request_id, route=p.get("route", "generations"),
                model_alias=p.get("model_alias", ""), stream_offset=p.get("stream_offset", 0),
                request_sha256=p.get("request_sha256"), idempotency_key_sha256=p.get("idempotency_key_sha256"),
                deadline_at=parse_time(p.get("deadline_at")), at=at, offset=e.offset)
        key_sha = p.get("idempotency_key_sha256")
        if key_sha:
            current = self._claims.get((e.tenant_id, key_sha))
            if current is None or at - current.at > IDEMPOTENCY_WINDOW:
                self._claims[(e.tenant_id, key_sha)] = Claim(request_id, p.get("request_sha256"), at, e.offset)
