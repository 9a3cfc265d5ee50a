"""Dedicated batch pools on real services (Redis broker, S3, each event log): a tenant
assigned a pool has its chunks run only by that pool's batch worker, even while a shared
batch worker is idle beside it; with no worker of the pool its batch waits and says so;
a shared tenant's batch runs as before. Workers run the stand-in engine
(`tests.gated_batch_worker`): where chunks run is tested here, not the text."""
from __future__ import annotations

import os
import uuid
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from api.cli.processes import _batch_worker_argv, arguments
from models.events_batch import BatchChunkCompleted, BatchChunkQueued, BatchChunkStarted, BatchWaitingForPool
from models.settings import Settings
from pipelines.admin import commands as admin
from tests.harness import MODEL_ALIAS
from tests.helpers import Launched, wait_until
from tests.integration.batch_fixtures import BatchPlatform, _env_of, _log_opener, s3_settings
from tests.integration.outage_batch import CHUNK, assert_every_row_once, submit
from workers.vllm_engine import VllmEngineConfig, engine_config_hash

POOL = "gold"
WAITING = f"waiting for a batch worker of pool {POOL}"


@contextmanager
def pool_platform(kind: str, home: Path, tiny_model_dir: Path, broker_url: str):
    log_settings, opener = _log_opener(kind, home)
    settings = Settings(home=home, **log_settings, **s3_settings(), celery_broker_url=broker_url,
                        batch_queue=f"batch-{uuid.uuid4().hex[:8]}", batch_chunk_time_limit_s=120,
                        batch_max_file_bytes=1_000_000, max_model_len=512)
    config_hash = engine_config_hash(VllmEngineConfig(model=tiny_model_dir, max_model_len=512))
    plat = BatchPlatform(kind, settings, opener, f"tiny@{config_hash}", celery_app="tests.gated_batch_worker")
    try:
        plat.start()
        admin.approve_model(plat.view, alias=MODEL_ALIAS, model_revision=plat.model_revision,
                            model_path=str(tiny_model_dir), engine_config_hash=config_hash, max_model_len=512,
                            actor="tests")
        yield plat
    finally:
        plat.close()


def start_pool_worker(plat: BatchPlatform) -> Launched:
    """`ledgerlm serve batch-worker --pool gold` as it would exec, on the stand-in engine."""
    argv = _batch_worker_argv(plat.settings, arguments("batch-worker", "--pool", POOL))
    argv[argv.index("workers.batch.celery_app")] = "tests.gated_batch_worker"
    env = {**os.environ, **_env_of(plat.settings), "PYTHONUNBUFFERED": "1", "LEDGERLM_BATCH_POOL": POOL}
    return Launched(argv + ["--without-gossip", "--without-mingle"], env=env,
                    log=plat.settings.home / "pool-worker.log", ready="ready.", ready_s=120)


def of(events, kind):
    return [env.payload for _, env in events if isinstance(env.payload, kind)]


def worker_pids(events) -> set[int]:
    return {int(p.worker_id.rsplit(":", 1)[1]) for p in of(events, BatchChunkStarted) + of(events, BatchChunkCompleted)}


@pytest.mark.parametrize("kind", ["embedded", "kafka"])
def test_a_dedicated_tenants_batch_waits_for_its_pool_and_runs_only_on_its_worker(kind, tmp_path, tiny_model_dir,
                                                                                 redis_url, s3_endpoint):
    with pool_platform(kind, tmp_path, tiny_model_dir, redis_url) as plat:
        dedicated, dedicated_secret = plat.tenant()
        admin.set_limits(plat.view, tenant_id=dedicated, actor="tests", pool=POOL)
        shared, shared_secret = plat.tenant()
        client, batch, ids = submit(plat, dedicated_secret, 3 * CHUNK)
        http = plat.http(dedicated_secret)

        def waiting():
            plat.check()
            body = http.get(f"/v1/batches/{batch.id}").json()
            return body if body.get("status_detail") == WAITING else None
        body = wait_until(waiting, 60, every_s=0.2, what="the batch to say it waits for its pool's worker")
        assert body["status"] == "in_progress"

        # A shared tenant's batch runs on the shared worker meanwhile, as before.
        shared_client, shared_batch, shared_ids = submit(plat, shared_secret, 2 * CHUNK)
        done = plat.wait_terminal(lambda: shared_client.batches.retrieve(shared_batch.id), 120)
        assert_every_row_once(plat, shared_client, done, shared, shared_ids)
        shared_events = plat.events(shared)
        assert worker_pids(shared_events) <= set(plat.worker.children()) and worker_pids(shared_events)
        assert not of(shared_events, BatchWaitingForPool)

        # The idle shared worker never took the dedicated tenant's chunks: they still wait.
        events = plat.events(dedicated)
        assert of(events, BatchChunkQueued) and not of(events, BatchChunkStarted), "nothing spilled to the shared pool"
        assert [p.pool for p in of(events, BatchWaitingForPool)] == [POOL], "said once"
        assert http.get(f"/v1/batches/{batch.id}").json()["status_detail"] == WAITING

        with start_pool_worker(plat) as pool_worker:
            done = plat.wait_terminal(lambda: client.batches.retrieve(batch.id), 120)
            assert_every_row_once(plat, client, done, dedicated, ids)
            events = plat.events(dedicated)
            pids = worker_pids(events)
            assert pids and pids <= {c.pid for c in psutil.Process(pool_worker.pid).children()}, pids
            assert {p.worker_id.split("@")[0] for p in of(events, BatchChunkStarted)} == {f"batch.{POOL}"}
            assert Counter(p.chunk_index for p in of(events, BatchChunkCompleted)) == Counter(range(3))
            assert http.get(f"/v1/batches/{batch.id}").json()["status_detail"] is None
