"""Workload classes by prompt length: `short`, `medium` or `long`, from a request's input
tokens. A long prompt holds many times the KV cache of a short one and waits longer for its
first token, so latency objectives are judged per class: the API's latency histograms carry
the class as a label, and the SLO report (`pipelines.projections.slo`) groups by it.

The thresholds are settings (`prompt_short_max_tokens`, `prompt_long_min_tokens`); their
defaults are declared here, once. They are sized for the platform's models: a chat turn or
a question fits 256 tokens; 1024 or more is a document or a long history, a quarter or more
of SmolLM2's 4096- to 8192-token context. With a 512-token engine (the tiny model's
default) no prompt is long: lower `prompt_long_min_tokens` to match such a fleet.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PromptClass = Literal["short", "medium", "long"]
PROMPT_CLASSES: tuple[PromptClass, ...] = ("short", "medium", "long")

SHORT_MAX_TOKENS = 256  # default: a prompt of at most this many tokens is short
LONG_MIN_TOKENS = 1024  # default: a prompt of at least this many tokens is long


def prompt_class(input_tokens: int, *, short_max_tokens: int, long_min_tokens: int) -> PromptClass:
    """The class of a prompt of `input_tokens` tokens: short up to `short_max_tokens`, long
    from `long_min_tokens`, medium between them."""
    if input_tokens <= short_max_tokens:
        return "short"
    if input_tokens >= long_min_tokens:
        return "long"
    return "medium"


def check_thresholds(short_max_tokens: int, long_min_tokens: int) -> None:
    """A ValueError naming the settings when they cannot make three disjoint classes."""
    for name, value in (("prompt_short_max_tokens", short_max_tokens), ("prompt_long_min_tokens", long_min_tokens)):
        if value < 0:
            raise ValueError(f"{name} (LEDGERLM_{name.upper()}) must be 0 or more, not {value}")
    if long_min_tokens <= short_max_tokens:
        raise ValueError(f"prompt_long_min_tokens (LEDGERLM_PROMPT_LONG_MIN_TOKENS, {long_min_tokens}) must be "
                         f"above prompt_short_max_tokens (LEDGERLM_PROMPT_SHORT_MAX_TOKENS, {short_max_tokens}): "
                         f"a prompt cannot be both short and long")


@dataclass(frozen=True)
class PromptThresholds:
    """The two thresholds in force, checked when made."""

    short_max_tokens: int = SHORT_MAX_TOKENS
    long_min_tokens: int = LONG_MIN_TOKENS

    def __post_init__(self) -> None:
        check_thresholds(self.short_max_tokens, self.long_min_tokens)

    @classmethod
    def from_settings(cls, settings) -> "PromptThresholds":
        return cls(settings.prompt_short_max_tokens, settings.prompt_long_min_tokens)

    def classify(self, input_tokens: int) -> PromptClass:
        return prompt_class(input_tokens, short_max_tokens=self.short_max_tokens,
                            long_min_tokens=self.long_min_tokens)
