"""Tokenizing batch inputs with the pinned revision's own tokenizer.

The dispatcher tokenizes every request once, at validation, and the chunk input carries
the token ids to the worker, which runs exactly those ids: the reservation, the context
check and the reported usage all count the same tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from pipelines.generation.tokencount import templated

SEPARATOR = "\n\n"  # between summaries joined for a reduce call


@lru_cache(maxsize=8)
def tokenizer_for(model_path: str):
    from transformers import AutoTokenizer  # heavy import, only where tokenizing happens

    return AutoTokenizer.from_pretrained(model_path)


def encode_completion(tokenizer, prompt: str) -> list[int]:
    return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    # The chat template writes its own special tokens (BOS), so none are added again.
    # `ChatTemplateMissing` where the model has none.
    text = templated(tokenizer, messages)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_text(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass(frozen=True)
class TemplateIds:
    """A summarization template split at `{text}`, as token ids."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    sep: tuple[int, ...]

    @property
    def overhead(self) -> int:
        return len(self.prefix) + len(self.suffix)

    def prompt(self, content: list[int]) -> list[int]:
        return [*self.prefix, *content, *self.suffix]


def template_ids(tokenizer, template: str) -> TemplateIds:
    before, _, after = template.partition("{text}")
    prefix = tokenizer(before, add_special_tokens=True)["input_ids"]  # the BOS comes with the prefix
    return TemplateIds(tuple(prefix), tuple(encode_text(tokenizer, after)), tuple(encode_text(tokenizer, SEPARATOR)))
