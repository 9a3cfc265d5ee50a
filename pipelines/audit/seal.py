"""Sealing chain heads on time: the newest trail row of each partition, signed, whenever
it is not signed yet. The projector seals every `audit_seal_every_s` while it runs and once
more when it stops, so the records after the last signed head are at most that old; an
unsigned tail is what a consistent rewrite of log and trail could replace unseen.

Seals go to their own table (`audit_seals`), outside the projections: the record-count
checkpoints a replay reproduces stay as they were, and `audit verify` checks a seal as
it checks a checkpoint (its signature, and that the chain still reaches it).
"""
from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone

from sqlalchemy import Engine, func, select

from models.tables import audit_checkpoints, audit_seals, audit_trail
from pipelines.signing import Signer, checkpoint_message

logger = logging.getLogger(__name__)


def _latest(conn, table, column) -> dict[tuple[str, int], int]:
    c = table.c
    return {(topic, partition): value for topic, partition, value in conn.execute(
        select(c.topic, c.partition, func.max(getattr(c, column))).group_by(c.topic, c.partition))}


def seal_heads(engine: Engine, signer: Signer, *, now: datetime | None = None) -> int:
    """Signs each partition's newest trail row not signed yet; returns how many it sealed."""
    now = now or datetime.now(timezone.utc)
    t = audit_trail.c
    sealed = 0
    with engine.begin() as conn:
        heads = _latest(conn, audit_trail, "offset")  # the primary key's order: no scan for the newest
        signed = _latest(conn, audit_checkpoints, "offset")
        for tp, offset in _latest(conn, audit_seals, "offset").items():
            signed[tp] = max(offset, signed.get(tp, -1))
        rows = []
        for (topic, partition), offset in sorted(heads.items()):
            if signed.get((topic, partition), -1) >= offset:
                continue
            seq, link = conn.execute(select(t.seq, t.link).where(
                t.topic == topic, t.partition == partition, t.offset == offset)).one()
            link = bytes(link)
            rows.append({"topic": topic, "partition": partition, "seq": seq, "offset": offset, "link": link,
                         "key_id": signer.key_id, "sealed_at": now,
                         "signature": signer.sign(checkpoint_message(topic, partition, seq, offset, link))})
        if rows:
            conn.execute(audit_seals.insert(), rows)
            sealed = len(rows)
    return sealed


class Sealer:
    """Seals every `every_s` in a thread of its own until `stop`, which seals once more."""

    def __init__(self, engine: Engine, signer: Signer, every_s: float):
        self._engine, self._signer, self._every_s = engine, signer, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="audit-sealer", daemon=True)

    def start(self) -> "Sealer":
        self._thread.start()
        return self

    def _seal(self) -> None:
        try:
            seal_heads(self._engine, self._signer)
        except Exception:  # the database may be away a while: the next round seals what is due
            logger.exception("sealing audit chain heads failed; trying again")

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            self._seal()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._seal()
