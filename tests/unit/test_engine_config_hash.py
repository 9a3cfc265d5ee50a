import shutil
from dataclasses import replace

import pytest

from workers.tiny_model import make_tiny_model
from workers.vllm_engine import VllmEngine, VllmEngineConfig, engine_config_hash, engine_version


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> VllmEngineConfig:
    return VllmEngineConfig(model=make_tiny_model(tmp_path_factory.mktemp("m") / "tiny"))


def test_hash_is_short_and_stable(config):
    assert engine_config_hash(config) == engine_config_hash(replace(config))
    assert len(engine_config_hash(config)) == 12
    assert VllmEngine(config).engine_config_hash() == engine_config_hash(config)


def test_same_model_elsewhere_pins_the_same_revision(config, tmp_path):
    moved = shutil.copytree(config.model, tmp_path / "copy")
    assert engine_config_hash(replace(config, model=moved)) == engine_config_hash(config)


def test_capacity_settings_do_not_change_the_revision(config):
    bigger = replace(config, kv_cache_gb=4.0, max_num_seqs=64, shutdown_timeout_s=1.0)
    assert engine_config_hash(bigger) == engine_config_hash(config)


@pytest.mark.parametrize(
    "change",
    [{"dtype": "bfloat16"}, {"seed": 1}, {"max_model_len": 1024}, {"enforce_eager": False}],
)
def test_output_settings_change_the_revision(config, change):
    assert engine_config_hash(replace(config, **change)) != engine_config_hash(config)


def test_another_engine_version_is_another_revision(config):
    assert engine_config_hash(config, "vllm 0.32.0") != engine_config_hash(config, "vllm 0.33.0")
    assert engine_config_hash(config) == engine_config_hash(config, engine_version())
    assert engine_version().split()[1][0].isdigit(), engine_version()


def test_other_weights_change_the_revision(config, tmp_path):
    other = make_tiny_model(tmp_path / "seed1", seed=1)
    assert engine_config_hash(replace(config, model=other)) != engine_config_hash(config)


def test_count_tokens_needs_no_running_engine(config):
    engine = VllmEngine(config)
    assert engine.count_tokens("the ledger") == 3  # <s> the ledger
    assert engine.count_tokens("") == 1
