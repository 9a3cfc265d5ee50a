"""Counts prompt tokens with the pinned revision's own tokenizer, as the engine will."""
from __future__ import annotations

import json
import logging
import threading
from functools import lru_cache
from pathlib import Path
from typing import Iterable

logger = logging.getLogger(__name__)


class TokenizerUnavailable(OSError):
    """The tokenizer of a revision cannot be loaded here."""


class ChatTemplateMissing(ValueError):
    """The model has no chat template, so messages cannot be made into its prompt."""


def chat_template_missing(model_revision: str) -> str:
    """What a chat request to a revision without a chat template is told."""
    return (f"model revision {model_revision} has no chat template: use /v1/completions or approve a model "
            f"with one")


CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def has_chat_template(model_dir: str | Path) -> bool:
    """Whether the model directory holds a chat template, where the tokenizer reads one:
    `chat_template` in tokenizer_config.json, or a chat_template.jinja (.json) beside it.
    Reads the files only (no tokenizer loads)."""
    path = Path(model_dir)
    if any((path / name).is_file() for name in CHAT_TEMPLATE_FILES):
        return True
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def templated(tokenizer, messages: list[dict]) -> str:
    """The messages as the model's prompt text, by its chat template; `ChatTemplateMissing`
    where it has none (transformers would raise a bare ValueError)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateMissing("the model has no chat template")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class TokenCounter:
    def __init__(self):
        self._lock = threading.Lock()
        self._ready: set[str] = set()  # paths whose tokenizer has loaded

    def loaded(self, model_path: str) -> bool:
        """Whether that tokenizer is loaded (counting with it costs no load)."""
        return model_path in self._ready

    @staticmethod
    @lru_cache(maxsize=16)
    def _tokenizer(model_path: str):
        from transformers import AutoTokenizer  # heavy import, only where counting happens

        return AutoTokenizer.from_pretrained(model_path)

    def warm(self, model_paths: Iterable[str]) -> int:
        """Loads these tokenizers now (an API does so in the background as it starts): the
        first load imports transformers and torch, seconds of CPU a first request would
        otherwise wait for. Returns how many loaded; a path that fails is left to the first
        request that needs it, which reports the error."""
        loaded = 0
        for path in dict.fromkeys(model_paths):
            try:
                with self._lock:
                    self._tokenizer(path)
                self._ready.add(path)
                loaded += 1
            except Exception as exc:  # noqa: BLE001 - a revision whose files are gone must not stop the API
                logger.warning("tokenizer of %s not loaded at start: %s", path, exc)
        return loaded

    def _loaded(self, model_path: str):
        """The tokenizer (call with the lock held); `TokenizerUnavailable` when it cannot be
        loaded (files gone, a path that names nothing)."""
        try:
            tokenizer = self._tokenizer(model_path)
        except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, HF errors...
            raise TokenizerUnavailable(f"{type(exc).__name__}: {str(exc)[:200]}") from exc
        self._ready.add(model_path)
        return tokenizer

    def count(self, model_path: str, text: str) -> int:
        with self._lock:  # HF fast tokenizers are not safe to share across threads mid-call
            return len(self._loaded(model_path)(text)["input_ids"])

    def chat_prompt(self, model_path: str, messages: list[dict]) -> str:
        with self._lock:
            return templated(self._loaded(model_path), messages)
