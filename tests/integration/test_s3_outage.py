"""The S3 server (MinIO, one of the test's own: `tests.dedicated_services`) stopped while a
chunk is between its generation and its Parquet write, for longer than the chunk's Celery
retries would last, then started again on its data. What must hold: the worker waits the
store out in place (the chunk starts once and fails never), the batch completes once the
server is back, and the parts hold exactly the expected rows: one whole part per chunk,
no partial object and no upload left open. The worker reports not ready meanwhile
(`ledgerlm_ready{component="batch-worker"}` on its metrics)."""
from __future__ import annotations

import re
import time
import uuid

import httpx

from models.events_batch import BatchChunkFailed, BatchChunkStarted
from tests.dedicated_services import DedicatedMinio
from tests.harness import free_port
from tests.helpers import wait_until
from tests.integration.outage_batch import CHUNK, assert_every_row_once, gated_batch_platform, submit
from tests.integration.test_batch_lifecycle import of_batch
from workers.batch import BACKOFF_S, MAX_RETRIES

# Longer than every Celery retry of a chunk put together: riding it out is not luck.
OUTAGE_S = sum(BACKOFF_S * 2 ** n for n in range(MAX_RETRIES)) + 2
NOT_READY = "batch-worker: not ready"  # `Readiness.down`, said once per outage


def worker_ready(port: int) -> float | None:
    """The worker's `ledgerlm_ready` gauge, or None while its metrics do not answer."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    found = re.search(r'^ledgerlm_ready\{component="batch-worker"\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else None


def test_a_parquet_write_waits_out_the_s3_server_and_the_batch_completes_with_every_row_once(
        tmp_path, tiny_model_dir, redis_url, monkeypatch):
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("LEDGERLM_TEST_BATCH_GATE", str(gate))
    metrics_port = free_port()
    monkeypatch.setenv("LEDGERLM_METRICS_PORT", str(metrics_port))
    with DedicatedMinio(tmp_path / "s3") as s3:
        store = {"object_store_url": f"s3://{s3.bucket}/run-{uuid.uuid4().hex[:8]}", "s3_endpoint_url": s3.endpoint,
                 "s3_key": s3.key, "s3_secret": s3.secret}
        with gated_batch_platform(tmp_path / "platform", tiny_model_dir, broker_url=redis_url, store=store) as plat:
            tenant_id, secret = plat.tenant()
            client, batch, custom_ids = submit(plat, secret, 3 * CHUNK)
            wait_until(lambda: (gate / "held-1").exists(), 60, what="the first chunk to be generating")

            s3.stop()
            down_at = time.monotonic()
            (gate / "open").touch()  # the chunk's rows are made; its write meets the stopped server
            plat.worker.wait_until(lambda: NOT_READY in plat.worker.output()
                                   and time.monotonic() - down_at >= OUTAGE_S, OUTAGE_S + 30,
                                   what="the write to meet the outage, and the outage to last its length")
            assert worker_ready(metrics_port) == 0.0
            plat.check()

            s3.start()
            done = plat.wait_terminal(lambda: client.batches.retrieve(batch.id), timeout_s=60)
            plat.check()
            assert_every_row_once(plat, client, done, tenant_id, custom_ids)
            events = plat.events(tenant_id)
            assert [p.chunk_index for _, p in of_batch(events, batch.id, BatchChunkStarted)] == [0, 1, 2], \
                "each chunk started once: the outage used up no retry"
            assert not of_batch(events, batch.id, BatchChunkFailed)
            assert "ready again" in plat.worker.output() and worker_ready(metrics_port) == 1.0
            uploads = s3.filesystem().call_s3("list_multipart_uploads", Bucket=s3.bucket)
            assert not uploads.get("Uploads"), uploads
