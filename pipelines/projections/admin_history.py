"""Admin history: who changed what, one row per event of the admin topic, in log order.

Every admin event type is recorded, including ones added to the catalogue later: the
row keeps the payload (less the actor, which has its own column, and key hashes, which
an auditor never needs), and names its subject by the first identifying field present.
"""
from __future__ import annotations

from sqlalchemy import Connection

from models import topics
from models.events import canonical
from models.tables import admin_changes
from pipelines.projections.base import Event, Projection
from pipelines.projections.sql import insert_new

# A rollout's events are its own subject (one rollout's history is one subject's rows).
SUBJECT_FIELDS = ("rollout_id", "key_id", "alias", "model_revision", "batch_id", "tenant_id", "source")
LEFT_OUT = frozenset({"actor", "secret_sha256"})


def change_row(e: Event) -> dict:
    p = e.payload
    subject = next((p[f] for f in SUBJECT_FIELDS if p.get(f)), None)
    return {"offset": e.offset, "event_id": e.event_id, "event_type": e.type, "occurred_at": e.at(),
            "actor": p.get("actor"), "tenant_id": e.tenant_id, "subject": subject,
            "details": canonical({k: v for k, v in p.items() if k not in LEFT_OUT}).decode()}


class AdminHistoryProjection(Projection):
    name = "admin_history"
    tables = (admin_changes,)
    handles = None
    topics = frozenset({topics.ADMIN.name})

    def apply(self, conn: Connection, events: list[Event]) -> None:
        insert_new(conn, admin_changes, [change_row(e) for e in events if e.type is not None])
