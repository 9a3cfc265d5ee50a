"""A batch aliased to a revision approved with its own engine settings (bfloat16 here)
runs on that revision: the Celery worker builds the engine from the settings the revision
recorded, so its config hash matches the pin instead of being refused as a mismatch.
Real Redis, S3, Celery and vLLM (the tiny model on CPU)."""
from __future__ import annotations

from models.engine_settings import Device
from models.events_batch import BatchChunkFailed, BatchEngineStarted
from pipelines.admin import commands as admin
from tests.integration.test_batch_api import jsonl, lines_of, request_line, run_batch
from workers.engine_config import VllmEngineConfig, engine_config_hash

pytest_plugins = ["tests.integration.batch_fixtures"]
ALIAS = "tiny-bf16"


def test_a_batch_on_a_bfloat16_revision_runs_on_its_engine(batch_platform, tiny_model_dir):
    config_hash = engine_config_hash(VllmEngineConfig(model=tiny_model_dir, max_model_len=512, dtype="bfloat16"))
    revision = f"tiny@{config_hash}"
    assert revision != batch_platform.model_revision, "bfloat16 is its own revision"
    admin.approve_model(batch_platform.view, alias=ALIAS, model_revision=revision, model_path=str(tiny_model_dir),
                        engine_config_hash=config_hash, max_model_len=512, actor="tests",
                        engine_settings={"dtype": "bfloat16"}, device=Device("cpu"))
    tenant, secret = batch_platform.tenant()
    client = batch_platform.openai(secret)
    ids = [f"bf16-{i}" for i in range(3)]
    done = run_batch(batch_platform, client, jsonl(request_line(i, f"Entry {n}", model=ALIAS, max_tokens=4)
                                                    for n, i in enumerate(ids)))
    events = [env.payload for _, env in batch_platform.events(tenant)]
    refused = [p.message for p in events if isinstance(p, BatchChunkFailed) and p.batch_id == done.id]
    assert refused == [] and done.status == "completed", (refused, done)
    assert done.request_counts.completed == 3
    output = lines_of(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == ids
    assert {line["response"]["body"]["system_fingerprint"] for line in output} == {revision}
    # no other batch here runs bfloat16, so the worker built an engine for this one
    assert any(isinstance(p, BatchEngineStarted) and p.batch_id == done.id for p in events)
