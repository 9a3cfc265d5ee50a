"""Pytest plugin with the shared tiny model and ONE vLLM engine per test session (start
takes ~25 s). Register with `pytest_plugins = ["tests.engine_fixture"]` or `-p`."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from models.settings import Settings
from pipelines.bootstrap import Bootstrap
from workers.engine_runner import EngineRunner
from workers.tiny_model import make_tiny_model
from workers.vllm_engine import VllmEngine, VllmEngineConfig

ENGINE_START_TIMEOUT_S = 600.0


def engine_processes() -> list[psutil.Process]:
    """vLLM's EngineCore and worker processes below this one (they retitle themselves)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.name().startswith("VLLM::") and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


def tiny_engine_config(model: Path, **overrides) -> VllmEngineConfig:
    return VllmEngineConfig(
        model=model, max_model_len=512, max_num_seqs=8, kv_cache_gb=0.125, **overrides
    )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def engine_runner(tiny_model_dir: Path) -> Iterator[EngineRunner]:
    """The started engine on its loop thread; submit coroutines with `.submit()`. Built the
    way a worker builds its own (`LEDGERLM_ENGINE_FACTORY` names another factory), with the
    capacity of `tiny_engine_config`."""
    settings = Settings(model=tiny_model_dir, max_model_len=512, engine_max_seqs=8, kv_cache_gb=0.125)
    runner = EngineRunner(Bootstrap(settings).engine(), name="vllm-engine")
    runner.start(timeout=ENGINE_START_TIMEOUT_S)
    yield runner
    runner.close()
    assert not engine_processes(), "vLLM processes outlived the engine"


@pytest.fixture(scope="session")
def vllm_engine(engine_runner: EngineRunner) -> VllmEngine:
    return engine_runner.engine  # type: ignore[return-value]
