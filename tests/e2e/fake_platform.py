"""The whole platform (admission, a pool worker, the API over HTTP) on an embedded log with
a fake engine in place of vLLM: the tiny model's tokenizer counts input, and every
admitted generation completes at once with one token. For tests that send many requests
through every route and need them served, not the engine's output."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from migrations.runner import upgrade
from models.settings import Settings
from tests.conftest import make_log_opener
from tests.fake_engine import FakeEngine
from tests.harness import Platform
from workers.engine_runner import EngineRunner


class FakeTinyEngine(FakeEngine):
    def __init__(self, model_dir: Path):
        super().__init__(hold=False)
        self.config = SimpleNamespace(model=model_dir, max_model_len=512)

    def max_model_len(self) -> int:
        return self.config.max_model_len


def fake_platform(home: Path, model_dir: Path) -> tuple[Platform, EngineRunner]:
    """The platform and its engine's runner; close the platform, then the runner."""
    runner = EngineRunner(FakeTinyEngine(model_dir), name="fake-engine").start()
    settings = Settings(home=home, grace_s=5.0, default_deadline_ms=60_000)
    upgrade(settings.database_url)  # the projector's tables, which the read routes query
    platform = Platform(make_log_opener("embedded", home), runner, settings)
    platform.kind = "embedded"
    return platform, runner
