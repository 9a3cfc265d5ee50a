"""Running one chunk of a batch: the handler behind the Celery task.

    stopped batch           → BatchChunkSkipped, nothing runs
    part already written    → BatchChunkCompleted again, from the usage the part recorded
                              (an earlier attempt finished but could not report)
    otherwise               → BatchChunkStarted; generate; write the ONE part at the
                              chunk's derived key (a retry overwrites it; a store that is
                              away is waited out); BatchChunkCompleted

Events go straight to the log (the dispatcher ignores a repeated report of a chunk).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from models import batch_keys as keys
from models import topics
from models.events import Payload, new_event
from models.events_batch import (
    BatchChunkCompleted, BatchChunkFailed, BatchChunkSkipped, BatchChunkStarted, BatchEngineStarted,
    BatchEngineStarting,
)
from models.summarization import Shape
from pipelines.batch.lines import request_id
from pipelines.batch.schemas import REQUEST_PART, SUMMARY_PART, read_table, read_usage, write_table
from pipelines.batch.tokens import template_ids, tokenizer_for
from pipelines.eventlog import EventLog
from pipelines.objectstore import ObjectStore
from pipelines.outage import Readiness, is_transient, ride_out
from pipelines.publish import publish
from workers.batch_engine import EngineSlot, GenRequest
from workers.summarize import summarize_documents


class ChunkEngineFailed(RuntimeError):
    """Making the chunk's rows failed with what looks like an outage (a timeout, say). Not
    waited out in place: the engine's state is not trusted, so the task's retry drops it."""


@dataclass(frozen=True)
class ChunkTask:
    tenant_id: str
    batch_id: str
    chunk_index: int
    reservation_id: str
    endpoint: str
    model_alias: str | None
    model_revision: str
    model_path: str
    engine_config_hash: str
    max_model_len: int
    input_key: str
    part_key: str
    summarization: dict | None = None
    artifact_manifest: str | None = None  # tasks queued before approvals recorded files carry none
    # The revision's recorded engine settings (`EngineSettings.model_dump()`); None for a revision
    # approved before they were recorded, and in tasks queued before chunks carried them.
    engine_settings: dict | None = None
    pool: str | None = None  # the tenant's dedicated pool, whose own queue brought the task; None: shared


def report(log: EventLog, task: ChunkTask, payload: Payload) -> None:
    publish(log, topics.BATCHES, [new_event(payload, tenant_id=task.tenant_id, correlation_id=task.batch_id)])


def report_failure(log: EventLog, task: ChunkTask, code: str, message: str, worker_id: str) -> None:
    report(log, task, BatchChunkFailed(batch_id=task.batch_id, chunk_index=task.chunk_index, error_code=code,
                                       message=message[:2000], worker_id=worker_id))


def run_chunk(task: ChunkTask, *, store: ObjectStore, log: EventLog, engines: EngineSlot, worker_id: str,
              attempt: int, readiness: Readiness | None = None, store_patience_s: float = 0.0) -> str:
    """Runs the chunk (or finds it done) and reports it; returns what happened. A store that
    is away when the part is written is waited out for up to `store_patience_s`."""
    usage = read_usage(store, task.part_key)
    # Looked for right before starting: the gap between the look and `BatchChunkStarted`
    # is where a stop written meanwhile goes unseen (this chunk then runs and is settled).
    marker = keys.stop_marker_key(task.tenant_id, task.batch_id)
    if usage is None and store.exists(marker):
        reason = store.get_bytes(marker).decode().strip()
        reason = reason if reason in ("batch_cancelled", "batch_expired") else "batch_cancelled"
        report(log, task, BatchChunkSkipped(batch_id=task.batch_id, chunk_index=task.chunk_index, reason=reason))
        return "skipped"
    if usage is None:
        report(log, task, BatchChunkStarted(batch_id=task.batch_id, chunk_index=task.chunk_index,
                                            worker_id=worker_id, attempt=attempt))
        began = time.monotonic()
        rows = read_table(store, task.input_key).to_pylist()
        try:
            engine = _engine(task, engines, log, worker_id)
            if task.summarization:
                out, usage = _summaries(task, rows, engine, store)
            else:
                out, usage = _completions(task, rows, engine)
        except Exception as exc:
            if is_transient(exc):
                raise ChunkEngineFailed(f"{type(exc).__name__}: {exc}") from exc
            raise
        usage["duration_ms"] = int((time.monotonic() - began) * 1000)
        # Retried in place: the rows are made, and making them again would cost the whole run.
        ride_out(lambda: write_table(store, task.part_key, out, SUMMARY_PART if task.summarization else REQUEST_PART,
                                     usage), readiness=readiness or Readiness("batch-worker"),
                 deadline_s=store_patience_s)
    report(log, task, BatchChunkCompleted(
        batch_id=task.batch_id, chunk_index=task.chunk_index, part_key=task.part_key, completed=usage["completed"],
        failed=usage["failed"], input_tokens=usage["input_tokens"], output_tokens=usage["output_tokens"],
        model_revision=task.model_revision, worker_id=worker_id, duration_ms=usage.get("duration_ms", 0),
        map_reduced=usage.get("map_reduced", 0)))
    return "completed"


def _engine(task: ChunkTask, engines: EngineSlot, log: EventLog, worker_id: str):
    """The chunk's engine; starting one (seconds, on a first chunk) is reported, so the
    batch's status can say so until it is up."""
    ids = {"batch_id": task.batch_id, "chunk_index": task.chunk_index, "worker_id": worker_id}
    return engines.get(
        model_path=task.model_path, max_model_len=task.max_model_len, pinned_hash=task.engine_config_hash,
        artifact_manifest=task.artifact_manifest, engine_settings=task.engine_settings, on_starting=lambda: report(log, task, BatchEngineStarting(**ids)),
        on_started=lambda s: report(log, task, BatchEngineStarted(**ids, duration_ms=int(s * 1000))))


def _usage(rows: list[dict], ok) -> dict:
    completed = sum(1 for r in rows if ok(r))
    return {"completed": completed, "failed": len(rows) - completed,
            "input_tokens": sum(r["input_tokens"] for r in rows),
            "output_tokens": sum(r["output_tokens"] for r in rows)}


def _completions(task: ChunkTask, rows: list[dict], engine) -> tuple[list[dict], dict]:
    requests = [GenRequest(r["prompt_token_ids"], r["max_tokens"], r["temperature"], r["top_p"], r["seed"],
                           list(r["stop"] or []), r["ignore_eos"]) for r in rows]
    results = engine.generate(requests, tenant_id=task.tenant_id)
    created = int(datetime.now(timezone.utc).timestamp())
    chat = task.endpoint == "/v1/chat/completions"
    out = []
    for row, result in zip(rows, results):
        rid = request_id(task.batch_id, row["line"])
        base = {"line": row["line"], "custom_id": row["custom_id"], "request_id": rid,
                "input_tokens": result.prompt_tokens, "output_tokens": len(result.token_ids)}
        if result.error:
            out.append({**base, "status_code": 400, "body": None, "error_code": "invalid_request",
                        "error_message": result.error, "input_tokens": 0, "output_tokens": 0})
            continue
        usage = {"prompt_tokens": result.prompt_tokens, "completion_tokens": len(result.token_ids),
                 "total_tokens": result.prompt_tokens + len(result.token_ids)}
        choice = {"index": 0, "finish_reason": result.finish_reason, "logprobs": None}
        if chat:
            body = {"id": "chatcmpl-" + rid[len("batch_req_"):], "object": "chat.completion",
                    "choices": [{**choice, "message": {"role": "assistant", "content": result.text}}]}
        else:
            body = {"id": "cmpl-" + rid[len("batch_req_"):], "object": "text_completion",
                    "choices": [{**choice, "text": result.text}]}
        body.update(created=created, model=task.model_alias, system_fingerprint=task.model_revision, usage=usage)
        out.append({**base, "status_code": 200, "body": json.dumps(body, ensure_ascii=False), "error_code": None,
                    "error_message": None})
    return out, _usage(out, lambda r: r["status_code"] == 200)


def _summaries(task: ChunkTask, rows: list[dict], engine, store: ObjectStore) -> tuple[list[dict], dict]:
    spec = task.summarization
    template = json.loads(store.get_bytes(spec["spec_key"]))["prompt_template"]
    tids = template_ids(tokenizer_for(task.model_path), template)
    shape = Shape(task.max_model_len, tids.overhead, spec["max_output_tokens"], len(tids.sep))
    out, map_reduced = summarize_documents(rows, engine=engine, tenant_id=task.tenant_id, tids=tids, shape=shape,
                                           temperature=spec["temperature"], model_revision=task.model_revision)
    usage = _usage(out, lambda r: r["error"] is None)
    usage["map_reduced"] = map_reduced
    return out, usage
