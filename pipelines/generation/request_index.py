"""What an API process knows of recent generations, read from the durable topics.

Read on demand, never in the background: a lookup first reads the requests, ledger and
outcomes topics (from `window` ago) up to their current end, so it sees every event
appended before the call, by any replica (read-your-writes). Status
rows are folded with the generations projection's own `merge`, so they say what the
projection will say; the projection (SQL) answers for anything older than `window`.
Memory is one small row per generation of the window.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

from models import topics
from models.topics import Topic
from pipelines.eventlog import EventLog, partition_for
from pipelines.eventlog.base import Tail
from pipelines.generation.idempotency import WINDOW as IDEMPOTENCY_WINDOW, Claim
from pipelines.projections.base import Event, parse_record, parse_time, schema_versions
from pipelines.projections.generations import TYPES as STATUS_TYPES, merge, new_row

STATUS_TOPICS = (topics.REQUESTS, topics.LEDGER, topics.OUTCOMES)
logger = logging.getLogger(__name__)


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
    chosen_request_id: str | None = None  # the request_id its client chose, if it chose one


class RequestIndex:
    def __init__(self, log: EventLog, *, window: timedelta = IDEMPOTENCY_WINDOW + timedelta(hours=1),
                 catch_up_timeout_s: float = 10.0):
        self._log = log
        self._window = window
        self._timeout_s = catch_up_timeout_s
        self._versions = schema_versions()
        self._tails: dict[str, Tail] = {}
        self._locks = {t.name: threading.Lock() for t in STATUS_TOPICS}
        self._requests: dict[tuple[str, str], RequestInfo] = {}
        self._claims: dict[tuple[str, str], Claim] = {}
        self._rows: dict[tuple[str, str], dict[str, Any]] = {}

    # -- lookups (each reads the log up to its end first) -------------------------------

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

    def chosen_request_ids(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """The request_ids clients chose, of those of these (tenant, generation id) that chose
        one and are within the window."""
        self.catch_up("", (topics.REQUESTS,))
        found = {key: self._requests.get(key) for key in keys}
        return {key: info.chosen_request_id for key, info in found.items() if info and info.chosen_request_id}

    def warm(self) -> None:
        """Reads the window now (an API calls this in the background at start), so the first
        lookup does not pay for it. A failure only leaves that to the first lookup."""
        try:
            self.catch_up("", STATUS_TOPICS)
        except Exception:
            logger.exception("request index: warming up failed; lookups will read the log")

    def known_status(self, tenant_id: str, request_id: str) -> str | None:
        """The status as last read, without reading the log (None: not known yet)."""
        row = self._rows.get((tenant_id, request_id))
        return row["status"] if row else None

    # -- reading -----------------------------------------------------------------------

    def catch_up(self, tenant_id: str, which: Iterable[Topic], *, at_least: int | None = None) -> None:
        """Reads each topic up to its end as of now (every partition: one tail per topic, so
        no reader hops between partitions). `at_least`: an offset of the tenant's requests
        partition that must be read, even if the end was read before it was visible."""
        for topic in which:
            with self._locks[topic.name]:
                tail = self._tail(topic.name)
                ends = tail.end_offsets()
                if at_least is not None and topic is topics.REQUESTS:
                    mine = partition_for(tenant_id, len(ends))
                    ends[mine] = max(ends[mine], at_least + 1)
                try:
                    for record in tail.read_to(ends, timeout_s=self._timeout_s, max_records=5000):
                        self._fold(parse_record(record, self._versions))
                except TimeoutError:
                    logger.warning("request index: caught up only to %s of %s", tail.offsets, ends)

    def _tail(self, topic: str) -> Tail:
        if topic not in self._tails:
            tail = self._log.tail(topic, {p: 0 for p in range(self._log.partitions(topic))})
            try:
                tail.seek_to_time(int((datetime.now(timezone.utc) - self._window).timestamp() * 1000))
            except BaseException:
                tail.close()  # the next look opens another: one per failed look would pile up
                raise
            self._tails[topic] = tail
        return self._tails[topic]

    def close(self) -> None:
        for tail in self._tails.values():
            tail.close()
        self._tails.clear()

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
                deadline_at=parse_time(p.get("deadline_at")), at=at, offset=e.offset,
                chosen_request_id=p.get("chosen_request_id"))
        key_sha = p.get("idempotency_key_sha256")
        if key_sha:
            current = self._claims.get((e.tenant_id, key_sha))
            if current is None or at - current.at > IDEMPOTENCY_WINDOW:
                self._claims[(e.tenant_id, key_sha)] = Claim(request_id, p.get("request_sha256"), at, e.offset)
