"""Job status of offline batches (`batches`, `batch_chunks`) and one usage-ledger row per
settled chunk (`BatchUsageSettled`).

Every event of a batch lives on the tenant's partition of the batches topic, so a
projection sees them in log order; the rules still keep a row's end state independent
of the few reorderings the log allows (a chunk's completion may land before it is
marked queued; a retried chunk may report twice: its first terminal report wins, as in
`models.batch`).
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from models.tables import batch_chunks, batches, usage_daily, usage_ledger
from pipelines.projections.base import Event, Projection
from pipelines.projections.generations import utc
from pipelines.projections.sql import insert_new, select_by_keys, upsert
from pipelines.projections.usage_daily import Rollup

BATCH_TERMINAL = {"BatchCompleted": "completed", "BatchFailed": "failed", "BatchCancelled": "cancelled",
                  "BatchExpired": "expired"}
# Non-terminal stages, by how far along they are; a batch never goes back a stage.
BATCH_STAGES = {"BatchSubmitted": ("validating", 0), "BatchValidated": ("in_progress", 1),
                "BatchCancelRequested": ("cancelling", 2), "BatchFinalizationStarted": ("finalizing", 2)}
CHUNK_TERMINAL = {"BatchChunkCompleted": "completed", "BatchChunkFailed": "failed", "BatchChunkSkipped": "skipped"}
CHUNK_TYPES = frozenset({"BatchChunkQueued", "BatchChunkStarted", "BatchUsageSettled", *CHUNK_TERMINAL})
STAGE_RANK = {status: rank for status, rank in BATCH_STAGES.values()} | {s: 3 for s in BATCH_TERMINAL.values()}


def merge_batch(row: dict, e: Event) -> None:
    p, t = e.payload, e.type
    if t == "BatchSubmitted":
        row.update(application_id=p.get("application_id"), key_id=p.get("key_id"), created_at=e.at())
        row["model_alias"] = row["model_alias"] or p.get("model_alias")
    elif t == "BatchValidated":
        row.update(model_alias=p.get("model_alias"), model_revision=p.get("model_revision"),
                   request_count=p.get("total_requests"), chunk_count=len(p.get("chunks") or ()))
    if t in BATCH_TERMINAL:
        if STAGE_RANK[row["status"]] < 3:  # the first end is the end
            row.update(status=BATCH_TERMINAL[t], ended_at=e.at())
    elif t in BATCH_STAGES and BATCH_STAGES[t][1] > STAGE_RANK[row["status"]]:
        row["status"] = BATCH_STAGES[t][0]


def merge_chunk(row: dict, e: Event) -> bool:
    """Folds a chunk event into its row; True when this event settled it."""
    p, t = e.payload, e.type
    ended = row["status"] in CHUNK_TERMINAL.values()
    if t == "BatchChunkQueued":
        row.update(reservation_id=p.get("reservation_id"), reserved_tokens=p.get("tokens"),
                   reserved_cost_micros=p.get("cost_micros"))
        if row["status"] == "pending":
            row["status"] = "queued"
    elif t == "BatchChunkStarted":
        row["attempts"] = max(row["attempts"] or 0, p.get("attempt") or 1)
        if not ended:
            row["status"] = "running"
    elif t in CHUNK_TERMINAL and not ended:
        row.update(status=CHUNK_TERMINAL[t], completed=p.get("completed"), failed=p.get("failed"),
                   model_revision=p.get("model_revision"), duration_ms=p.get("duration_ms"),
                   error_code=p.get("error_code") or p.get("reason"), ended_at=e.at())
        if not row["settled"]:
            row.update(input_tokens=p.get("input_tokens", 0), output_tokens=p.get("output_tokens", 0))
    elif t == "BatchUsageSettled" and not row["settled"]:
        row.update(settled=True, input_tokens=p.get("input_tokens", 0), output_tokens=p.get("output_tokens", 0),
                   cost_micros=p.get("cost_micros", 0), settled_at=e.at())
        row["reservation_id"] = row["reservation_id"] or p.get("reservation_id")
        return True
    return False


def chunk_usage_row(chunk: dict, batch: dict[str, Any]) -> dict:
    at = utc(chunk["settled_at"])
    return {"tenant_id": chunk["tenant_id"], "source": "batch_chunk",
            "source_id": f"{chunk['batch_id']}:{chunk['chunk_index']}", "batch_id": chunk["batch_id"],
            "application_id": batch.get("application_id"), "key_id": batch.get("key_id"),
            "model_alias": batch.get("model_alias"),
            "model_revision": chunk["model_revision"] or batch.get("model_revision"),
            "input_tokens": chunk["input_tokens"], "output_tokens": chunk["output_tokens"],
            "cost_micros": chunk["cost_micros"], "queued_ms": None, "ttft_ms": None,
            "duration_ms": chunk["duration_ms"], "finish_reason": None,
            "terminal_status": chunk["status"] if chunk["status"] in CHUNK_TERMINAL.values() else "settled",
            "settled_at": at, "day": at.strftime("%Y-%m-%d")}


def _blank(table, **key) -> dict:
    return {**{c.name: None for c in table.columns}, **key}


class BatchesProjection(Projection):
    name = "batches"
    tables = (batches, batch_chunks, usage_ledger, usage_daily)
    handles = frozenset({*BATCH_TERMINAL, *BATCH_STAGES, *CHUNK_TYPES})

    def apply(self, conn: Connection, events: list[Event]) -> None:
        events = [e for e in events if e.payload.get("batch_id")]
        batch_keys = {(e.tenant_id, e.payload["batch_id"]) for e in events}
        chunk_keys = {(e.tenant_id, e.payload["batch_id"], e.payload.get("chunk_index"))
                      for e in events if e.type in CHUNK_TYPES}
        rows = {(r["tenant_id"], r["batch_id"]): r for r in select_by_keys(conn, batches, batch_keys)}
        chunks = {(r["tenant_id"], r["batch_id"], r["chunk_index"]): r
                  for r in select_by_keys(conn, batch_chunks, chunk_keys)}
        changed_batches, changed_chunks, settled = set(), set(), []
        for e in events:
            bkey = (e.tenant_id, e.payload["batch_id"])
            if bkey not in rows:
                rows[bkey] = _blank(batches, tenant_id=bkey[0], batch_id=bkey[1], status="validating")
            if e.type in CHUNK_TYPES:
                ckey = (*bkey, e.payload.get("chunk_index"))
                if ckey not in chunks:
                    chunks[ckey] = _blank(batch_chunks, tenant_id=bkey[0], batch_id=bkey[1], chunk_index=ckey[2],
                                          status="pending", attempts=0, input_tokens=0, output_tokens=0,
                                          cost_micros=0, settled=False)
                changed_chunks.add(ckey)
                if merge_chunk(chunks[ckey], e):
                    settled.append(ckey)
            else:
                merge_batch(rows[bkey], e)
                changed_batches.add(bkey)
        upsert(conn, batches, [rows[k] for k in changed_batches])
        upsert(conn, batch_chunks, [chunks[k] for k in changed_chunks])
        ledger = [chunk_usage_row(chunks[k], rows[k[:2]]) for k in settled]
        insert_new(conn, usage_ledger, ledger)
        # A chunk settles once (its row says so), so its ledger row is new: it only adds.
        rollup = Rollup()
        for row in ledger:
            rollup.change(None, row)
        rollup.write(conn)
