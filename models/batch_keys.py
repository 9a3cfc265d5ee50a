"""Where batch objects live in the object store. Every key starts with the tenant's own
prefix, and every derived key is a function of (tenant, batch, chunk) alone, so a retry
writes the same object again instead of a second one."""
from __future__ import annotations


def tenant_prefix(tenant_id: str) -> str:
    return f"tenants/{tenant_id}/"


def file_key(tenant_id: str, file_id: str) -> str:
    return f"{tenant_prefix(tenant_id)}files/{file_id}"


def batch_prefix(tenant_id: str, batch_id: str) -> str:
    return f"{tenant_prefix(tenant_id)}batches/{batch_id}/"


def chunk_input_key(tenant_id: str, batch_id: str, chunk_index: int) -> str:
    return f"{batch_prefix(tenant_id, batch_id)}chunks/{chunk_index:05d}.input.parquet"


def part_key(tenant_id: str, batch_id: str, chunk_index: int) -> str:
    return f"{batch_prefix(tenant_id, batch_id)}parts/{chunk_index:05d}.parquet"


def invalid_lines_key(tenant_id: str, batch_id: str) -> str:
    return f"{batch_prefix(tenant_id, batch_id)}invalid.jsonl"


def stop_marker_key(tenant_id: str, batch_id: str) -> str:
    """Present once the batch may start no new chunk; workers look before running one."""
    return f"{batch_prefix(tenant_id, batch_id)}control/stopped"


def spec_key(tenant_id: str, batch_id: str) -> str:
    return f"{batch_prefix(tenant_id, batch_id)}spec.json"


def summarization_prefix(tenant_id: str, batch_id: str) -> str:
    """The dataset a summarization job leaves: `data/*.parquet` and `manifest.json`."""
    return f"{tenant_prefix(tenant_id)}summarizations/{batch_id}/"


def summary_part_key(output_prefix: str, chunk_index: int) -> str:
    return f"{output_prefix}data/part-{chunk_index:05d}.parquet"


def summary_errors_key(output_prefix: str) -> str:
    return f"{output_prefix}data/part-errors.parquet"


def manifest_key(output_prefix: str) -> str:
    return f"{output_prefix}manifest.json"


def output_file_id(batch_id: str) -> str:
    return f"file-{batch_id.removeprefix('batch_')}-output"


def error_file_id(batch_id: str) -> str:
    return f"file-{batch_id.removeprefix('batch_')}-errors"
