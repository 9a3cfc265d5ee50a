"""The logging level of every process: `LEDGERLM_LOG_LEVEL` (default WARNING).

The platform's own loggers follow the root logger, which `configure_logging` sets. vLLM
configures its loggers itself when imported, in the worker's process and in its engine
core's, at `VLLM_LOGGING_LEVEL` (INFO unless set): `engine_logging` sets that to ours
unless the environment names one, so an engine prints no INFO line at WARNING either.
"""
from __future__ import annotations

import logging
import os

ENV = "LEDGERLM_LOG_LEVEL"
DEFAULT = "WARNING"


def log_level() -> str:
    """The configured level's name (DEBUG, INFO, WARNING, ERROR or CRITICAL)."""
    name = os.environ.get(ENV, "").strip().upper() or DEFAULT
    if not isinstance(logging.getLevelName(name), int):
        raise ValueError(f"{ENV}={os.environ.get(ENV)!r} is no logging level "
                         f"(DEBUG, INFO, WARNING, ERROR or CRITICAL)")
    return name


def configure_logging() -> str:
    """Sets this process's logging, and its engine's, to the configured level; returns it."""
    level = log_level()
    logging.basicConfig(level=level)
    logging.getLogger().setLevel(level)  # also where logging was configured before
    engine_logging(level)
    return level


def engine_logging(level: str | None = None) -> None:
    """vLLM at the configured level (unless `VLLM_LOGGING_LEVEL` says otherwise): before it
    is imported, and in the processes it starts, through the environment they inherit."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", level or log_level())
    logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())
