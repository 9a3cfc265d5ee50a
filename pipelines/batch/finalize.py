"""Finalizing a batch: its output and error files assembled from the chunks' Parquet
parts, the validation errors and the chunks that never ran. Every request of the input
ends in exactly one of the two files. Files are written at keys derived from the batch,
so finalizing again after a crash rewrites the same objects.

Summarization jobs need no assembly: the workers' parts already are the output dataset
(`data/part-*.parquet`); finalizing adds `data/part-errors.parquet` for rows that did not
run and `manifest.json` describing the whole.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from datetime import datetime, timezone

from models import batch_keys as keys
from models.batch import BatchState, ChunkState
from models.events_batch import BatchCancelled, BatchCompleted, BatchExpired, FileUploaded, RequestCounts
from models.summarization import OUTPUT_SCHEMA
from pipelines.batch.lines import error_line
from pipelines.batch.schemas import SUMMARY_PART, read_table, write_table
from pipelines.objectstore import ObjectStore

SKIP_MESSAGES = {
    "insufficient_quota": "the batch budget was exhausted before this request ran",
    "batch_cancelled": "the batch was cancelled before this request ran",
    "batch_expired": "the batch's completion window passed before this request ran",
}


def _not_run(chunk: ChunkState) -> tuple[str, str]:
    code = chunk.error_code or "chunk_failed"
    return code, SKIP_MESSAGES.get(code, f"the request's chunk failed after its retries ({code})")


def _terminal_type(batch: BatchState):
    if batch.cancel_requested:
        return BatchCancelled
    return BatchExpired if batch.window_elapsed else BatchCompleted


class _JsonlOut:
    """A JSONL file built locally, then stored in one write."""

    def __init__(self):
        self.file = tempfile.NamedTemporaryFile("w+b", suffix=".jsonl")
        self.lines, self.bytes, self.sha = 0, 0, hashlib.sha256()

    def write(self, obj: dict) -> None:
        data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        self.file.write(data)
        self.sha.update(data)
        self.lines += 1
        self.bytes += len(data)

    def store(self, store: ObjectStore, batch: BatchState, file_id: str, filename: str) -> FileUploaded | None:
        try:
            if not self.lines:
                return None
            self.file.flush()
            key = keys.file_key(batch.tenant_id, file_id)
            store.put_file(key, self.file.name)
            return FileUploaded(file_id=file_id, purpose="batch_output", filename=filename, bytes=self.bytes,
                                object_key=key, sha256=self.sha.hexdigest(), batch_id=batch.batch_id)
        finally:
            self.file.close()


def _invalid_lines(store: ObjectStore, batch: BatchState) -> list[dict]:
    key = keys.invalid_lines_key(batch.tenant_id, batch.batch_id)
    if not store.exists(key):
        return []
    return [json.loads(line) for line in store.get_bytes(key).splitlines() if line.strip()]


def finalize_requests(batch: BatchState, *, store: ObjectStore) -> list:
    """Output and error files of an OpenAI batch; returns the payloads to append."""
    output, errors = _JsonlOut(), []
    for chunk in batch.chunks:
        if chunk.status == "completed":
            for row in read_table(store, chunk.part_key).to_pylist():
                if row["status_code"] == 200:
                    output.write({"id": row["request_id"], "custom_id": row["custom_id"], "error": None,
                                  "response": {"status_code": 200, "request_id": row["request_id"],
                                               "body": json.loads(row["body"])}})
                else:
                    errors.append(error_line(batch.batch_id, row["line"], row["custom_id"], row["error_code"],
                                             row["error_message"]))
            continue
        code, message = _not_run(chunk)
        rows = read_table(store, keys.chunk_input_key(batch.tenant_id, batch.batch_id, chunk.index))
        for line, custom_id in zip(rows.column("line").to_pylist(), rows.column("custom_id").to_pylist()):
            errors.append(error_line(batch.batch_id, line, custom_id, code, message))
    errors = sorted(errors + _invalid_lines(store, batch), key=lambda e: e["error"]["line"] or 0)
    error_out = _JsonlOut()
    for line in errors:
        error_out.write(line)
    completed = output.lines
    out_file = output.store(store, batch, keys.output_file_id(batch.batch_id), f"{batch.batch_id}_output.jsonl")
    err_file = error_out.store(store, batch, keys.error_file_id(batch.batch_id), f"{batch.batch_id}_errors.jsonl")
    input_tokens, output_tokens = batch.usage
    end = _terminal_type(batch)(
        batch_id=batch.batch_id, output_file_id=out_file and out_file.file_id,
        error_file_id=err_file and err_file.file_id,
        request_counts=RequestCounts(total=batch.total_requests, completed=completed, failed=len(errors)),
        input_tokens=input_tokens, output_tokens=output_tokens)
    return [f for f in (out_file, err_file) if f] + [end]


def _error_rows(store: ObjectStore, batch: BatchState) -> list[dict]:
    rows = []
    for row in _invalid_lines(store, batch):
        rows.append((row["row"], row["id"], f"{row['code']}: {row['message']}"))
    for chunk in batch.chunks:
        if chunk.status != "completed":
            code, message = _not_run(chunk)
            table = read_table(store, keys.chunk_input_key(batch.tenant_id, batch.batch_id, chunk.index))
            rows += [(r, i, f"{code}: {message}") for r, i in zip(table.column("row").to_pylist(),
                                                                 table.column("id").to_pylist())]
    rows.sort(key=lambda r: r[0])
    return [{"id": doc_id, "summary": None, "input_tokens": 0, "output_tokens": 0, "finish_reason": None,
             "model_revision": batch.model_revision, "error": error} for _, doc_id, error in rows]


def finalize_summaries(batch: BatchState, *, store: ObjectStore) -> list:
    """The error part and manifest of a summarization job; returns the payloads to append."""
    prefix = batch.summarization.output_prefix
    files = []
    for chunk in batch.chunks:
        key = keys.summary_part_key(prefix, chunk.index)
        if chunk.status == "completed":
            files.append({"uri": store.uri(key), "rows": chunk.completed + chunk.failed})
        else:
            store.delete(key)  # a late duplicate of a chunk reported failed must not add rows
    error_rows = _error_rows(store, batch)
    if error_rows:
        write_table(store, keys.summary_errors_key(prefix), error_rows, SUMMARY_PART)
        files.append({"uri": store.uri(keys.summary_errors_key(prefix)), "rows": len(error_rows)})
    completed = sum(c.completed for c in batch.chunks)
    failed = sum(c.failed for c in batch.chunks) + len(error_rows)
    input_tokens, output_tokens = batch.usage
    end_type = _terminal_type(batch)
    manifest = {
        "job_id": batch.batch_id, "status": {BatchCompleted: "completed", BatchCancelled: "cancelled",
                                              BatchExpired: "expired"}[end_type],
        "model_alias": batch.model_alias, "model_revision": batch.model_revision,
        "schema": [{"name": n, "type": t} for n, t in OUTPUT_SCHEMA], "data_uri": store.uri(prefix + "data/"),
        "files": files, "rows": completed + failed, "completed": completed, "failed": failed,
        "map_reduced": sum(c.map_reduced for c in batch.chunks),
        "input_tokens": input_tokens, "output_tokens": output_tokens,
        "created_at": batch.created_at.isoformat(), "finalized_at": datetime.now(timezone.utc).isoformat(),
    }
    store.put_bytes(keys.manifest_key(prefix), json.dumps(manifest, indent=2).encode())
    return [end_type(batch_id=batch.batch_id, output_uri=store.uri(prefix),
                     request_counts=RequestCounts(total=batch.total_requests, completed=completed, failed=failed),
                     input_tokens=input_tokens, output_tokens=output_tokens)]

