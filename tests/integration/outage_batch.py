"""The batch platform for the backing-service outage tests: the API, the dispatcher and a
Celery worker with a stand-in engine (`tests.gated_batch_worker`), on an embedded log,
with the broker and object store the test names (its own Redis or MinIO, or the shared
ones), and what such a test checks once the batch has ended."""
from __future__ import annotations

import uuid
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from models import batch_keys as keys
from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.batch.schemas import read_table
from pipelines.outage import is_transient
from tests.harness import MODEL_ALIAS
from tests.integration.batch_fixtures import BatchPlatform, _log_opener
from tests.integration.test_batch_api import jsonl, lines_of, request_line, upload
from workers.vllm_engine import VllmEngineConfig, engine_config_hash

CHUNK = 4  # the platform's chunk size (`BatchPlatform.chunk_size`)


@contextmanager
def gated_batch_platform(home: Path, tiny_model_dir: Path, *, broker_url: str, store: dict,
                         requeue_after_s: float = 600.0) -> Iterator[BatchPlatform]:
    """`store`: object_store_url, s3_endpoint_url, s3_key, s3_secret."""
    log_settings, opener = _log_opener("embedded", home)
    settings = Settings(home=home, **log_settings, **store, celery_broker_url=broker_url,
                        batch_queue=f"batch-{uuid.uuid4().hex[:8]}", batch_chunk_time_limit_s=120,
                        batch_max_file_bytes=1_000_000, max_model_len=512)
    config_hash = engine_config_hash(VllmEngineConfig(model=tiny_model_dir, max_model_len=512))
    plat = BatchPlatform("embedded", settings, opener, f"tiny@{config_hash}", celery_app="tests.gated_batch_worker",
                         requeue_after_s=requeue_after_s)
    try:
        plat.start()
        admin.approve_model(plat.view, alias=MODEL_ALIAS, model_revision=plat.model_revision,
                            model_path=str(tiny_model_dir), engine_config_hash=config_hash, max_model_len=512,
                            actor="tests")
        yield plat
    finally:
        try:
            plat.close()  # its processes first; last, the objects it wrote
        except Exception as exc:  # noqa: BLE001 - the store may be the service a failed test left stopped
            if not is_transient(exc):
                raise


def submit(plat: BatchPlatform, secret: str, requests: int):
    """A batch of `requests` chat lines; returns (client, batch, custom ids)."""
    client = plat.openai(secret)
    lines = [request_line(f"r{i:03d}", f"Line {i}", max_tokens=4) for i in range(requests)]
    file = upload(client, jsonl(lines))
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    return client, batch, [line["custom_id"] for line in lines]


def assert_every_row_once(plat: BatchPlatform, client, done, tenant_id: str, custom_ids: list[str]) -> None:
    """The batch completed; its Parquet parts (one per chunk, each whole) and its output
    file hold every request exactly once."""
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (len(custom_ids), 0), done.request_counts
    parts = plat.store.list(keys.batch_prefix(tenant_id, done.id) + "parts/")
    chunks = -(-len(custom_ids) // CHUNK)
    assert parts == [keys.part_key(tenant_id, done.id, i) for i in range(chunks)], parts
    in_parts = Counter(row for key in parts for row in read_table(plat.store, key).column("custom_id").to_pylist())
    assert in_parts == Counter(custom_ids), "every request once across the Parquet parts"
    output = Counter(line["custom_id"] for line in lines_of(client, done.output_file_id))
    assert output == Counter(custom_ids), "every request once in the output file"
    assert done.error_file_id is None
