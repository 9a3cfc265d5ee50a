"""Counts prompt tokens with the pinned revision's own tokenizer, as the engine will."""
from __future__ import annotations

import threading
from functools import lru_cache


class TokenCounter:
    def __init__(self):
        self._lock = threading.Lock()

    @staticmethod
    @lru_cache(maxsize=16)
    def _tokenizer(model_path: str):
        from transformers import AutoTokenizer  # heavy import, only where counting happens

        return AutoTokenizer.from_pretrained(model_path)

    def count(self, model_path: str, text: str) -> int:
        with self._lock:  # HF fast tokenizers are not safe to share across threads mid-call
            return len(self._tokenizer(model_path)(text)["input_ids"])

    def chat_prompt(self, model_path: str, messages: list[dict]) -> str:
        with self._lock:
            return self._tokenizer(model_path).apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
