"""Counts prompt tokens with the pinned revision's own tokenizer, as the engine will."""
from __future__ import annotations

import logging
import threading
from functools import lru_cache
from typing import Iterable

logger = logging.getLogger(__name__)


class TokenizerUnavailable(OSError):
    """The tokenizer of a revision cannot be loaded here."""


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
            return self._loaded(model_path).apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
