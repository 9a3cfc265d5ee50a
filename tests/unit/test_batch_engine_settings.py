"""A batch worker builds its engine from the revision's recorded engine settings, as the
interactive worker does: the chunk task carries them from the revision, and the engine the
slot makes hashes to the revision's pin. A revision approved before settings were recorded
runs on the engine it always did."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import workers.__main__ as workers_cli
import workers.batch_engine as batch_engine
from models.engine_settings import Device, EngineSettings
from models.events import new_event
from models.events_admin import ModelRevisionApproved
from models.registry import Registry
from models.settings import Settings
from pipelines.batch.reconcile import DispatchOptions, Reconciler
from pipelines.bootstrap import Bootstrap
from workers import batch_runner
from workers.batch_engine import EngineMismatch, EngineSlot, batch_config
from workers.engine_config import VllmEngineConfig, engine_config_hash
from workers.revision import engine_settings
from tests.model_dirs import fresh_home, registry_now, stand_in_model

CAPACITY = {"max_num_seqs": 8, "kv_cache_gb": 0.5}  # what `workers.batch.resources` gives the slot


@pytest.fixture
def home(tmp_path, monkeypatch):
    return fresh_home(tmp_path, monkeypatch, "LEDGERLM_ENGINE_SETTINGS", "LEDGERLM_ENGINE_FACTORY", "LEDGERLM_MAX_MODEL_LEN")


@pytest.fixture
def model(tmp_path, monkeypatch):
    """A directory the engine port hashes as a model (no engine loads it here)."""
    return stand_in_model(tmp_path, monkeypatch)


def approve(alias: str, *flags: str):
    """`ledgerlm model approve` of the model as revision `alias`@1, with these engine flags."""
    assert workers_cli.main(["model", "approve", "--alias", alias, "--revision", f"{alias}@1", *flags]) == 0
    return registry_now().revisions[f"{alias}@1"]




def chunk_task(revision) -> batch_runner.ChunkTask:
    """The task the dispatcher queues for a chunk on `revision`, through JSON as the broker has it."""
    reconciler = Reconciler(store=None, queue=None, options=DispatchOptions(), budget_of=None, limits_for=None)
    batch = SimpleNamespace(tenant_id="acme", batch_id="b1", endpoint="/v1/chat/completions", model_alias="smol",
                            summarization=None)
    task = reconciler._task(batch, SimpleNamespace(index=0), revision, "res", Registry())  # noqa: SLF001 - the queued dict
    return batch_runner.ChunkTask(**json.loads(json.dumps(task)))


@pytest.fixture
def slot(monkeypatch):
    """An engine slot that records the configs it builds, and the worker's reports."""
    made: list[VllmEngineConfig] = []
    monkeypatch.setattr(batch_runner, "report", lambda log, task, payload: None)
    slot = EngineSlot(dict(CAPACITY), factory=lambda config: made.append(config) or SimpleNamespace(close=lambda: None))
    slot.made = made
    return slot


def engine_for(task: batch_runner.ChunkTask, slot: EngineSlot):
    return batch_runner._engine(task, slot, log=None, worker_id="w")  # noqa: SLF001 - the worker's own call


def test_a_batch_on_a_revision_with_its_own_settings_builds_that_engine_and_its_hash(home, model, slot):
    bf16 = approve("smol-bf16", "--dtype", "bfloat16", "--max-num-batched-tokens", "256")
    assert bf16.engine_settings.dtype == "bfloat16"
    task = chunk_task(bf16)
    assert task.engine_settings == bf16.engine_settings.model_dump()
    engine_for(task, slot)
    (config,) = slot.made
    assert (config.dtype, config.enforce_eager, config.max_num_batched_tokens) == ("bfloat16", True, 256)
    assert (config.kv_cache_gb, config.max_num_seqs) == (0.5, 8), "a KV cache the revision leaves open is the worker's"
    assert engine_config_hash(config) == bf16.engine_config_hash
    # the interactive worker of the same revision builds the same output settings
    interactive = Bootstrap(engine_settings(Settings(), bf16)).engine().config
    assert (interactive.dtype, interactive.enforce_eager) == (config.dtype, config.enforce_eager)


def test_the_slot_keeps_one_engine_per_revisions_settings(home, model, slot):
    fp32 = approve("smol")
    bf16 = approve("smol-bf16", "--dtype", "bfloat16")
    for revision in (fp32, fp32, bf16, bf16, fp32):
        engine_for(chunk_task(revision), slot)
    assert [c.dtype for c in slot.made] == ["float32", "bfloat16", "float32"], "warm reuse, and a switch on change"
    assert [engine_config_hash(c) for c in slot.made] == [fp32.engine_config_hash, bf16.engine_config_hash,
                                                          fp32.engine_config_hash]


def test_a_revision_approved_before_settings_were_recorded_runs_as_before(model, slot):
    before = VllmEngineConfig(model=model, max_model_len=512, **CAPACITY)  # what the slot always built
    registry = Registry()
    registry.apply(new_event(ModelRevisionApproved(
        model_revision="old@1", model_path=str(model), engine_config_hash=engine_config_hash(before),
        max_model_len=512, actor="t"), tenant_id="platform", correlation_id="c"))
    old = registry.revisions["old@1"]
    assert old.engine_settings is None
    task = chunk_task(old)
    assert task.engine_settings is None
    engine_for(task, slot)
    assert slot.made == [before]


def test_a_task_queued_without_the_settings_of_a_revision_that_has_them_is_refused(home, model, slot):
    bf16 = approve("smol-bf16", "--dtype", "bfloat16")
    task = chunk_task(bf16)
    queued_before = batch_runner.ChunkTask(**{**task.__dict__, "engine_settings": None})
    with pytest.raises(EngineMismatch, match=f"but the batch pinned {bf16.engine_config_hash}"):
        engine_for(queued_before, slot)
    unknown = batch_runner.ChunkTask(**{**task.__dict__, "engine_settings": {**task.engine_settings, "fp7": True}})
    with pytest.raises(EngineMismatch, match="not ones this worker can build") as refused:
        engine_for(unknown, slot)
    assert "\n" not in str(refused.value)
    assert slot.made == []


def test_on_a_gpu_a_kv_cache_the_revision_leaves_open_is_vllms(model, monkeypatch):
    monkeypatch.setattr(batch_engine, "detect_device", lambda: Device("gpu", 1))
    given = EngineSettings(dtype="auto", enforce_eager=False, gpu_memory_utilization=0.8)
    config = batch_config(model_path=str(model), max_model_len=512, capacity=CAPACITY, engine_settings=given)
    assert (config.kv_cache_gb, config.gpu_memory_utilization, config.dtype, config.enforce_eager) == \
        (None, 0.8, "auto", False)
    sized = batch_config(model_path=str(model), max_model_len=512, capacity=CAPACITY,
                         engine_settings=given.model_copy(update={"kv_cache_gb": 4.0}))
    assert sized.kv_cache_gb == 4.0
