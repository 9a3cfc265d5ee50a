"""`ledgerlm audit verify`: recompute every chain from the log and compare.

For each durable topic-partition, the log is read from its first offset and the stored
trail row by row beside it. Each record's hash and link are recomputed from its bytes
alone (no JSON decoding: this loop must do a million records in seconds) and checked
against the trail row at the same offset, and against the signed checkpoint whenever
one is due. The first disagreement of each partition is reported with its position,
what the trusted side says (`expected`) and what is there now (`found`).
"""
from __future__ import annotations

import hashlib
import queue
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from itertools import chain, islice, zip_longest
from typing import Iterator, Sequence

from sqlalchemy import Connection, Engine, func, select

from models import topics
from models.tables import audit_checkpoints, audit_seals, audit_trail
from models.audit_chain import CHECKPOINT_EVERY, genesis
from pipelines.signing import Verifier, checkpoint_message
from pipelines.eventlog import EventLog, Record, UnknownTopic

PAGE = 20_000


@dataclass(frozen=True)
class Finding:
    topic: str
    partition: int
    offset: int
    kind: str
    expected: str
    found: str
    detail: str

    def line(self) -> str:
        return (f"{self.topic}[{self.partition}]@{self.offset}: {self.kind}: {self.detail}; "
                f"expected {self.expected}, found {self.found}")


@dataclass
class VerifyReport:
    findings: list[Finding] = field(default_factory=list)
    records: int = 0
    partitions: int = 0
    checkpoints: int = 0
    unsigned_tail: int = 0  # verified records after the last signed checkpoint of their partition
    not_in_trail: int = 0  # records at the end of the log the projector has not chained yet
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def first(self) -> Finding | None:
        return self.findings[0] if self.findings else None


def _log_pages(log: EventLog, topic: str, partition: int) -> Iterator[list[Record]]:
    """The partition as of now, in pages handed whole to the prefetching thread."""
    try:
        records = log.read_partition(topic, partition, page=PAGE)
    except UnknownTopic:
        return  # gone since its partitions were counted: no records, so every chained one is missing
    while page := list(islice(records, PAGE)):
        yield page


def _trail_pages(conn: Connection, topic: str, partition: int) -> Iterator[list[tuple]]:
    """Pages of (offset, seq, event_hash, link), read through the driver's own cursor:
    a million rows through the SQLAlchemy row machinery would cost a second or more."""
    mark = "%s" if conn.dialect.name == "postgresql" else "?"
    sql = (f'SELECT "offset", seq, event_hash, link FROM audit_trail WHERE topic = {mark} AND "partition" = {mark}'
           f' AND "offset" > {mark} ORDER BY "offset" LIMIT {PAGE}')
    cursor = conn.connection.driver_connection.cursor()
    try:
        last = -1
        while True:
            cursor.execute(sql, (topic, partition, last))
            rows = cursor.fetchall()
            if rows:
                yield rows
            if len(rows) < PAGE:
                return
            last = rows[-1][0]
    finally:
        cursor.close()


def _prefetched(pages: Iterator[list], depth: int = 2) -> Iterator[list]:
    """Reads the next pages in a thread while this one is hashed: both database drivers
    release the GIL while they fetch, so reading the log and the trail overlap."""
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                slots.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for page in pages:
                if not put(page):
                    return
            put(end)
        except BaseException as exc:  # handed to the reader, raised there
            put(exc)

    thread = threading.Thread(target=produce, name="verify-prefetch", daemon=True)
    thread.start()
    try:
        while (item := slots.get()) is not end:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def _checkpoints(conn: Connection, topic: str, partition: int, verifier: Verifier) -> tuple[dict, list[Finding]]:
    """Signed heads: the checkpoints due every N records, and the seals made on time."""
    signed, bad = {}, []
    c, s = audit_checkpoints.c, audit_seals.c
    heads = chain(conn.execute(select(c.seq, c.offset, c.link, c.signature).where(c.topic == topic,
                                                                                  c.partition == partition)),
                  conn.execute(select(s.seq, s.offset, s.link, s.signature).where(s.topic == topic,
                                                                                  s.partition == partition)))
    for seq, offset, link, signature in heads:
        link = bytes(link)
        if verifier.verify(checkpoint_message(topic, partition, seq, offset, link), signature):
            signed[seq] = (offset, link)
        else:
            bad.append(Finding(topic, partition, offset, "checkpoint_signature", f"a valid signature by {verifier.key_id}",
                               signature[:16] + "...", f"checkpoint seq {seq} is not signed by this key"))
    return signed, bad


def verify_partition(log: EventLog, conn: Connection, topic: str, partition: int, verifier: Verifier,
                     every: int, report: VerifyReport) -> Finding | None:
    signed, bad = _checkpoints(conn, topic, partition, verifier)
    first_bad = min(bad, key=lambda f: f.offset) if bad else None
    log_pages = _prefetched(_log_pages(log, topic, partition))
    trail_pages = _trail_pages(conn, topic, partition)
    with closing(log_pages), closing(trail_pages):
        found = _walk(chain.from_iterable(log_pages), chain.from_iterable(trail_pages), signed, every,
                      topic, partition, report)
    report.checkpoints += len(signed)
    candidates = [f for f in (first_bad, found) if f is not None]  # at one offset, the bad signature says more
    return min(candidates, key=lambda f: f.offset) if candidates else None


def _walk(records: Iterator[Record], rows: Iterator[tuple], signed: dict, every: int, topic: str, partition: int,
          report: VerifyReport) -> Finding | None:
    """Walks the log and the trail side by side; returns the first disagreement."""
    sha256 = hashlib.sha256
    previous, seq, last_signed = genesis(topic, partition), 0, 0

    def finding(offset, kind, expected, found, detail):
        return Finding(topic, partition, offset, kind, expected, found, detail)

    for record, row in zip_longest(records, rows):
        if row is None:  # the projector has not chained these yet
            report.not_in_trail += 1 + sum(1 for _ in records)
            break
        offset, row_seq, row_hash, row_link = row
        if record is None:
            return finding(offset, "record_missing", bytes(row_hash).hex(), "no record (end of the log)",
                           "a chained record is gone from the end of the log")
        if record.offset != offset:
            if record.offset < offset:
                return finding(record.offset, "record_not_in_trail", f"no record (the trail's next is @{offset})",
                               sha256(record.value).hexdigest(), "the log has a record the trail never chained")
            return finding(offset, "record_missing", bytes(row_hash).hex(),
                           f"no record (the log's next is @{record.offset})", "a chained record is gone from the log")
        hashed = sha256(record.value).digest()
        link = sha256(previous + hashed).digest()
        seq += 1
        if hashed != row_hash:
            if link == row_link:
                return finding(offset, "trail_changed", hashed.hex(), bytes(row_hash).hex(),
                               "the trail row's event hash was altered")
            return finding(offset, "event_changed", bytes(row_hash).hex(), hashed.hex(),
                           "the record differs from the one chained")
        if link != row_link or row_seq != seq:
            return finding(offset, "trail_changed", f"seq {seq} link {link.hex()}",
                           f"seq {row_seq} link {bytes(row_link).hex()}", "the trail row's link was altered")
        if seq % every == 0 or seq in signed:  # due every N records, or sealed on time
            if seq not in signed:
                return finding(offset, "checkpoint_missing", f"a signed checkpoint at seq {seq}", "none",
                               "a due checkpoint is missing or unsigned")
            signed_offset, signed_link = signed[seq]
            if signed_offset != offset or signed_link != link:
                return finding(offset, "checkpoint_mismatch", f"@{signed_offset} {signed_link.hex()}",
                               f"@{offset} {link.hex()}", "the chain no longer reaches the signed head")
            last_signed = seq
        previous = link
        report.records += 1
    report.unsigned_tail += seq - last_signed
    return None


def _vanished(conn: Connection, topic: str) -> list[Finding]:
    """A topic missing from the log is fine if nothing of it was ever chained."""
    t = audit_trail.c
    first = conn.execute(select(t.partition, func.min(t.offset)).where(t.topic == topic)
                         .group_by(t.partition).order_by(t.partition)).all()
    return [Finding(topic, partition, offset, "record_missing", "the chained records of this topic",
                    "no such topic in the log", "a whole topic is gone from the log") for partition, offset in first]


def verify(log: EventLog, engine: Engine, verifier: Verifier, *, checkpoint_every: int = CHECKPOINT_EVERY,
           topic_names: Sequence[str] = tuple(t.name for t in topics.DURABLE)) -> VerifyReport:
    report = VerifyReport()
    started = time.perf_counter()
    with engine.connect() as conn:
        for topic in topic_names:
            try:
                partitions = log.partitions(topic)
            except UnknownTopic:
                report.findings += _vanished(conn, topic)
                continue
            for partition in range(partitions):
                report.partitions += 1
                found = verify_partition(log, conn, topic, partition, verifier, checkpoint_every, report)
                if found is not None:
                    report.findings.append(found)
    report.seconds = time.perf_counter() - started
    return report

