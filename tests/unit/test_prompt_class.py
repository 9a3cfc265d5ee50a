"""Prompt-length classes: the boundaries belong where the settings say, and settings that
cannot make three disjoint classes stop a process at start, naming the setting."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from models.prompt_class import LONG_MIN_TOKENS, SHORT_MAX_TOKENS, PromptThresholds, prompt_class
from models.settings import Settings


@pytest.mark.parametrize(("tokens", "expected"), [
    (0, "short"), (1, "short"), (256, "short"), (257, "medium"), (1023, "medium"), (1024, "long"), (50_000, "long"),
])
def test_the_default_thresholds_put_each_length_in_its_class(tokens, expected):
    assert SHORT_MAX_TOKENS == 256 and LONG_MIN_TOKENS == 1024
    assert prompt_class(tokens, short_max_tokens=256, long_min_tokens=1024) == expected
    assert PromptThresholds().classify(tokens) == expected


def test_adjacent_thresholds_leave_no_medium_class():
    classes = {prompt_class(n, short_max_tokens=10, long_min_tokens=11) for n in range(30)}
    assert classes == {"short", "long"}


def test_settings_carry_the_thresholds_into_the_classifier():
    settings = Settings(prompt_short_max_tokens=32, prompt_long_min_tokens=100)
    thresholds = PromptThresholds.from_settings(settings)
    assert [thresholds.classify(n) for n in (32, 33, 99, 100)] == ["short", "medium", "medium", "long"]


def test_defaults_come_from_one_declaration(monkeypatch):
    for name in ("LEDGERLM_PROMPT_SHORT_MAX_TOKENS", "LEDGERLM_PROMPT_LONG_MIN_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert (settings.prompt_short_max_tokens, settings.prompt_long_min_tokens) == (SHORT_MAX_TOKENS, LONG_MIN_TOKENS)


@pytest.mark.parametrize(("env", "named"), [
    ({"LEDGERLM_PROMPT_SHORT_MAX_TOKENS": "-1"}, "prompt_short_max_tokens"),
    ({"LEDGERLM_PROMPT_LONG_MIN_TOKENS": "-5"}, "prompt_long_min_tokens"),
    ({"LEDGERLM_PROMPT_SHORT_MAX_TOKENS": "300", "LEDGERLM_PROMPT_LONG_MIN_TOKENS": "200"}, "prompt_long_min_tokens"),
    ({"LEDGERLM_PROMPT_SHORT_MAX_TOKENS": "300", "LEDGERLM_PROMPT_LONG_MIN_TOKENS": "300"}, "prompt_long_min_tokens"),
])
def test_bad_thresholds_are_refused_with_the_settings_name(monkeypatch, env, named):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert named in str(refused.value)


@pytest.mark.parametrize(("short", "long"), [(-1, 10), (10, -1), (10, 10), (20, 10)])
def test_thresholds_made_directly_are_checked_too(short, long):
    with pytest.raises(ValueError, match="prompt_"):
        PromptThresholds(short, long)
