"""What the batch, file and summarization routes share: their services (an object store
and a view of the batches topic, made once per app on first use, so nothing connects at
import time), the `batch` scope, and the OpenAI-shaped objects they return."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from api.deps import ServicesDep, scope
from models.batch import BatchState, FileState
from models.registry import Principal
from pipelines.batch.view import BatchView
from pipelines.bootstrap import Bootstrap
from pipelines.objectstore import ObjectStore

_lock = threading.Lock()


@dataclass
class BatchServices:
    store: ObjectStore
    view: BatchView


def batch_services(request: Request, svc: ServicesDep) -> BatchServices:
    state = request.app.state
    with _lock:
        if getattr(state, "batch_services", None) is None:
            state.batch_services = BatchServices(Bootstrap(svc.settings).object_store(), BatchView(svc.log))
    return state.batch_services


BatchServicesDep = Annotated[BatchServices, Depends(batch_services)]
BatchDep = Annotated[Principal, scope("batch")]


def unix(value) -> int | None:
    return int(value.timestamp()) if value is not None else None


def file_object(f: FileState) -> dict:
    return {"id": f.file_id, "object": "file", "bytes": f.bytes, "created_at": unix(f.created_at),
            "filename": f.filename, "purpose": f.purpose, "status": "processed", "expires_at": None,
            "status_details": None}


def _common(b: BatchState) -> dict:
    counts = b.request_counts
    input_tokens, output_tokens = b.usage
    return {
        "id": b.batch_id, "status": b.status, "model": b.model_alias, "metadata": b.metadata or None,
        "input_file_id": b.input_file_id, "created_at": unix(b.created_at), "expires_at": unix(b.expires_at),
        **{name: unix(b.times.get(name)) for name in (
            "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
            "cancelled_at")},
        "errors": {"object": "list", "data": [e.model_dump() for e in b.errors]} if b.errors else None,
        "request_counts": counts.model_dump(),
        "status_detail": b.status_detail,  # e.g. "starting the batch engine", as a worker reported it
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                  "total_tokens": input_tokens + output_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


def batch_object(b: BatchState) -> dict:
    return {**_common(b), "object": "batch", "endpoint": b.endpoint, "completion_window": b.completion_window,
            "output_file_id": b.output_file_id, "error_file_id": b.error_file_id}


def summarization_object(b: BatchState, store: ObjectStore) -> dict:
    spec = b.summarization
    return {**_common(b), "object": "summarization", "model_revision": b.model_revision,
            "input_uri": store.uri(b.input_key), "max_output_tokens": spec.max_output_tokens,
            "output_uri": store.uri(spec.output_prefix), "data_uri": store.uri(spec.output_prefix + "data/"),
            "manifest_uri": store.uri(spec.output_prefix + "manifest.json"),
            "map_reduced": sum(c.map_reduced for c in b.chunks)}


def _id(item: BatchState | FileState) -> str:
    return item.batch_id if isinstance(item, BatchState) else item.file_id


def page(items: list, to_object, *, after: str | None, limit: int) -> dict:
    """OpenAI's cursor list: newest first, `after` is the last id of the previous page."""
    items = sorted(items, key=lambda x: (x.created_at, _id(x)), reverse=True)
    ids = [_id(x) for x in items]
    start = ids.index(after) + 1 if after in ids else 0
    chosen = items[start:start + limit]
    data = [to_object(x) for x in chosen]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": start + limit < len(items)}
