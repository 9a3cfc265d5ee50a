"""`/console/usage/export`: the usage ledger's rows of any date range, as CSV or Parquet.

Both stream: rows are read with a server-side cursor a batch at a time and sent as they are
written (CSV a row at a time, Parquet a row group at a time), so a range of years costs
bounded memory and the first bytes leave at once. There is no cap on the range.

The ledger stores `delivered_output_tokens` NULL when the whole output reached the client,
and `cached` NULL when the row was not answered from the semantic cache. The export fills
both as the other views read them (`delivered`, `usage_daily.contribution`, a generation's
status): delivered is all the output tokens then (never more than were generated), and
cached is false.
"""
from __future__ import annotations

import csv
import io
from datetime import datetime

import pyarrow as pa
import pyarrow.parquet as pq
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from api.console.auth import ConsoleRefusal, UserDep
from api.console.pages import day_range
from api.deps import projection_db
from pipelines.projections.console import EXPORT_COLUMNS, ledger_rows

router = APIRouter(prefix="/console", include_in_schema=False)
ROW_GROUP = 50_000

SCHEMA = pa.schema([
    ("tenant_id", pa.string()), ("source", pa.string()), ("source_id", pa.string()), ("batch_id", pa.string()),
    ("application_id", pa.string()), ("key_id", pa.string()), ("model_alias", pa.string()),
    ("model_revision", pa.string()), ("input_tokens", pa.int64()), ("output_tokens", pa.int64()),
    ("delivered_output_tokens", pa.int64()), ("cost_micros", pa.int64()), ("cached", pa.bool_()),
    ("queued_ms", pa.int32()), ("ttft_ms", pa.int32()), ("duration_ms", pa.int32()), ("finish_reason", pa.string()),
    ("terminal_status", pa.string()), ("settled_at", pa.timestamp("us", tz="UTC")), ("day", pa.string()),
])
assert tuple(SCHEMA.names) == EXPORT_COLUMNS
OUTPUT, DELIVERED, CACHED = (EXPORT_COLUMNS.index(c) for c in ("output_tokens", "delivered_output_tokens", "cached"))


def filled(row: tuple) -> tuple:
    """A ledger row with its delivered output tokens and cached flag as the other views show them."""
    cells = list(row)
    output, delivered = cells[OUTPUT], cells[DELIVERED]
    cells[DELIVERED] = output if delivered is None else min(delivered, output)
    cells[CACHED] = bool(cells[CACHED])
    return tuple(cells)


def _filled(batches):
    for batch in batches:
        yield [filled(row) for row in batch]


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(timespec="microseconds").replace("+00:00", "Z")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def csv_chunks(batches, chunk_bytes: int = 1 << 16):
    """CSV written a row at a time, sent in chunks of about `chunk_bytes`."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(EXPORT_COLUMNS)
    for batch in batches:
        for row in batch:
            writer.writerow([_cell(v) for v in row])
            if out.tell() >= chunk_bytes:
                yield out.getvalue().encode()
                out.seek(0)
                out.truncate()
    yield out.getvalue().encode()


class _Drain:
    """A file pyarrow writes into, emptied after each row group so its bytes can be sent."""

    def __init__(self):
        self.parts: list[bytes] = []
        self.position = 0
        self.closed = False

    def write(self, data) -> int:
        data = bytes(data)
        self.parts.append(data)
        self.position += len(data)
        return len(data)

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


def parquet_chunks(batches, row_group: int = ROW_GROUP):
    sink = _Drain()
    writer = pq.ParquetWriter(pa.PythonFile(sink, mode="w"), SCHEMA, compression="zstd")
    pending: list[tuple] = []

    def flush_group():
        columns = list(zip(*pending))
        writer.write_table(pa.table([pa.array(list(col), type=f.type) for col, f in zip(columns, SCHEMA)],
                                    schema=SCHEMA), row_group_size=row_group)
        pending.clear()

    for batch in batches:
        pending.extend(batch)
        if len(pending) >= row_group:
            flush_group()
            yield sink.take()
    if pending:
        flush_group()
    writer.close()
    yield sink.take()


@router.get("/usage/export")
def export(request: Request, user: UserDep, format: str = "csv", tenant: str | None = None, start: str | None = None,
           end: str | None = None):
    if format not in ("csv", "parquet"):
        raise ConsoleRefusal(400, "format is csv or parquet")
    tenant_id = user.tenant(tenant)
    first, last = day_range(start, end)
    batches = _filled(ledger_rows(projection_db(request), tenant_id=tenant_id, start=first, end=last))
    name = f"usage-{tenant_id or 'all'}-{first.isoformat()}-{last.isoformat()}.{format}"
    headers = {"Content-Disposition": f'attachment; filename="{name}"', "Cache-Control": "no-store"}
    if format == "csv":
        return StreamingResponse(csv_chunks(batches), media_type="text/csv; charset=utf-8", headers=headers)
    return StreamingResponse(parquet_chunks(batches), media_type="application/vnd.apache.parquet", headers=headers)
