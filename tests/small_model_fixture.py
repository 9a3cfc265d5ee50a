"""Pytest plugin: SmolLM2-135M-Instruct prepared where the install script caches it (the
platform home's models/), so a session converts it only when the cache is missing."""
from __future__ import annotations

from pathlib import Path

import pytest

from models.settings import Settings
from workers.small_model import default_dir, prepare_smollm2


@pytest.fixture(scope="session")
def small_model_dir() -> Path:
    return prepare_smollm2(default_dir(Settings().home)).resolve()
