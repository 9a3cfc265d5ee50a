"""LEDGERLM_LOG_LEVEL governs every process's logging: the platform's loggers, vLLM's (in
the worker and in the engine core it starts) and the projector's progress lines."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pipelines.log_level import configure_logging, log_level

ROOT = Path(__file__).resolve().parents[2]

# What a worker does before its engine starts: its logging configured, then vLLM imported
# (`workers.vllm_engine.VllmEngine.start`); the engine core's process inherits the environment.
SCRIPT = """
import logging, os, sys
from pipelines.log_level import configure_logging
configure_logging()
logging.getLogger("pipelines.ledgerlm_test").info("platform-info-line")
logging.getLogger("pipelines.ledgerlm_test").warning("platform-warning-line")
from vllm.logger import init_logger
init_logger("vllm.ledgerlm_test").info("engine-info-line")
init_logger("vllm.ledgerlm_test").warning("engine-warning-line")
print(os.environ["VLLM_LOGGING_LEVEL"])
"""


def run_script(level: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LEDGERLM_LOG_LEVEL", "VLLM_LOGGING_LEVEL")}
    if level is not None:
        env["LEDGERLM_LOG_LEVEL"] = level
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.parametrize("level", ["WARNING", None])  # unset: WARNING
def test_at_warning_neither_the_platform_nor_the_engine_prints_an_info_line(level):
    done = run_script(level)
    assert "platform-warning-line" in done.stderr and "engine-warning-line" in done.stderr
    assert "info-line" not in done.stderr, done.stderr
    assert done.stdout.strip() == "WARNING"  # what the engine core's process inherits


def test_at_info_both_print_their_info_lines():
    done = run_script("info")
    assert "platform-info-line" in done.stderr and "engine-info-line" in done.stderr, done.stderr
    assert done.stdout.strip() == "INFO"


def test_a_level_that_is_none_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("LEDGERLM_LOG_LEVEL", "LOUD")
    with pytest.raises(ValueError, match="LEDGERLM_LOG_LEVEL='LOUD' is no logging level"):
        log_level()


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    projections = logging.getLogger("pipelines.projections")
    saved = root.level, projections.level, os.environ.get("VLLM_LOGGING_LEVEL")
    yield
    root.setLevel(saved[0])
    projections.setLevel(saved[1])
    if saved[2] is None:
        os.environ.pop("VLLM_LOGGING_LEVEL", None)
    else:
        os.environ["VLLM_LOGGING_LEVEL"] = saved[2]


def test_the_projector_keeps_its_progress_lines_to_the_configured_level(tmp_path, monkeypatch, restore_logging):
    from api.cli.processes import PROCESSES, arguments, run
    from migrations.runner import upgrade
    from models.settings import Settings

    for name in ("LEDGERLM_EVENT_LOG_URL", "LEDGERLM_EVENT_LOG_NAMESPACE", "LEDGERLM_DATABASE_URL",
                 "VLLM_LOGGING_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LEDGERLM_HOME", str(tmp_path))
    monkeypatch.setenv("LEDGERLM_LOG_LEVEL", "WARNING")
    configure_logging()
    settings = Settings(metrics_port=0)
    upgrade(settings.database_url)
    stop = threading.Event()
    started = []
    code = run(PROCESSES["projector"], settings, arguments("projector"), stop,
               started=lambda running: (started.append(running), stop.set()))
    assert started and code == 0
    progress = logging.getLogger("pipelines.projections.runner")
    assert not progress.isEnabledFor(logging.INFO), "the projector raised its own loggers above the setting"
