"""The audit trail projection: chains every durable record and signs heads periodically.

It runs in the projection runner like any read model, so its rows and its positions
commit together; the head of each chain (seq, link) is kept in memory between batches
and reread from the last stored row after a restart or a rolled-back batch.
"""
from __future__ import annotations

import hashlib

from sqlalchemy import Connection, select

from models.tables import audit_checkpoints, audit_trail
from models.audit_chain import CHECKPOINT_EVERY, TEXT_TYPES, genesis
from pipelines.signing import Signer, checkpoint_message
from pipelines.projections.base import Event, Projection
from pipelines.projections.sql import bulk_insert

TRAIL_COLUMNS = ("topic", "partition", "offset", "seq", "event_hash", "link", "event_id", "event_type", "tenant_id",
                 "correlation_id", "occurred_at", "event")


class AuditTrailProjection(Projection):
    name = "audit"
    tables = (audit_trail, audit_checkpoints)
    handles = None  # every record, readable or not: the chain covers the bytes

    def __init__(self, signer: Signer, *, checkpoint_every: int = CHECKPOINT_EVERY):
        if checkpoint_every < 1:
            raise ValueError("checkpoint_every must be at least 1")
        self._signer = signer
        self.checkpoint_every = checkpoint_every
        self._heads: dict[tuple[str, int], tuple[int, bytes]] = {}

    def load(self, conn: Connection) -> None:
        self._heads = {}

    def _head(self, conn: Connection, topic: str, partition: int) -> tuple[int, bytes]:
        t = audit_trail.c
        last = conn.execute(select(t.seq, t.link).where(t.topic == topic, t.partition == partition)
                            .order_by(t.offset.desc()).limit(1)).first()
        return (last[0], bytes(last[1])) if last else (0, genesis(topic, partition))

    def apply(self, conn: Connection, events: list[Event]) -> None:
        rows, checkpoints = [], []
        every, sha256 = self.checkpoint_every, hashlib.sha256
        heads = self._heads
        for e in events:
            tp = (e.topic, e.partition)
            if tp not in heads:
                heads[tp] = self._head(conn, *tp)
            seq, previous = heads[tp]
            hashed = sha256(e.value).digest()
            link = sha256(previous + hashed).digest()
            seq += 1
            heads[tp] = (seq, link)
            readable = e.type is not None and e.type not in TEXT_TYPES
            rows.append((e.topic, e.partition, e.offset, seq, hashed, link, e.event_id, e.type, e.tenant_id,
                         e.correlation_id, e.at() if e.type else None,
                         e.value.decode() if readable else None))
            if seq % every == 0:
                signature = self._signer.sign(checkpoint_message(e.topic, e.partition, seq, e.offset, link))
                checkpoints.append({"topic": e.topic, "partition": e.partition, "seq": seq, "offset": e.offset,
                                    "link": link, "key_id": self._signer.key_id, "signature": signature})
        bulk_insert(conn, audit_trail, TRAIL_COLUMNS, rows)
        if checkpoints:
            conn.execute(audit_checkpoints.insert(), checkpoints)
