"""Parquet schemas of what moves between dispatcher, workers and finalizer, and the
helpers that write and read them through the object store. Usage totals of a part ride
in its file metadata, so a retry that finds the part already written can report it
without running the chunk again."""
from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from models.summarization import OUTPUT_SCHEMA
from pipelines.objectstore import ObjectStore

REQUEST_INPUT = pa.schema([
    ("line", pa.int64()), ("custom_id", pa.string()), ("prompt_token_ids", pa.list_(pa.int32())),
    ("max_tokens", pa.int32()), ("temperature", pa.float64()), ("top_p", pa.float64()), ("seed", pa.int64()),
    ("stop", pa.list_(pa.string())), ("ignore_eos", pa.bool_()),
])

DOCUMENT_INPUT = pa.schema([("row", pa.int64()), ("id", pa.string()), ("text_token_ids", pa.list_(pa.int32()))])

# One row per request of a chunk; `body` is the response body (JSON) or null on error.
REQUEST_PART = pa.schema([
    ("line", pa.int64()), ("custom_id", pa.string()), ("request_id", pa.string()), ("status_code", pa.int32()),
    ("body", pa.string()), ("error_code", pa.string()), ("error_message", pa.string()),
    ("input_tokens", pa.int64()), ("output_tokens", pa.int64()),
])

SUMMARY_PART = pa.schema([(name, pa.type_for_alias(kind)) for name, kind in OUTPUT_SCHEMA])

USAGE_KEY = b"ledgerlm.usage"


def write_table(store: ObjectStore, key: str, rows: list[dict], schema: pa.Schema,
                usage: dict | None = None) -> None:
    table = pa.Table.from_pylist(rows, schema=schema)
    if usage is not None:
        table = table.replace_schema_metadata({**(schema.metadata or {}), USAGE_KEY: json.dumps(usage).encode()})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    store.put_bytes(key, buffer.getvalue())


def read_table(store: ObjectStore, key: str) -> pa.Table:
    return pq.read_table(io.BytesIO(store.get_bytes(key)))


def read_usage(store: ObjectStore, key: str) -> dict | None:
    """The usage a written part recorded, or None when the part does not exist (yet)."""
    if not store.exists(key):
        return None
    with store.open_read(key) as f:
        metadata = pq.read_schema(f).metadata or {}
    raw = metadata.get(USAGE_KEY)
    return json.loads(raw) if raw else None
