"""The key-term check a semantic cache hit must pass besides similarity: prompts that an
embedding puts close together but that ask for another answer disagree; paraphrases that
keep their numbers, names, senses and directions agree. The examples are not from the
benchmark's paraphrase set (tests/perf/paraphrases.jsonl), so they test the rules rather
than the set they were written against."""
from __future__ import annotations

import pytest

from pipelines.cache.key_terms import agree

AGREE = [
    ("What is the boiling point of water at sea level?", "At sea level, what is the boiling point of water?"),
    ("Give me three ideas for a rainy weekend.", "Suggest three ideas for a rainy weekend."),
    ("How tall is the Eiffel Tower?", "What is the height of the Eiffel Tower?"),
    ("Translate 'good morning' into Spanish.", "Translate 'good morning' into Spanish, please."),
    ("what is the eiffel tower made of", "What is the Eiffel Tower made of?"),
]
DISAGREE = [
    ("Give me three ideas for a rainy weekend.", "Give me seven ideas for a rainy weekend.", "number"),
    ("How far is 12 km in miles?", "How far is 21 km in miles?", "number"),
    ("Should I water succulents in winter?", "Should I not water succulents in winter?", "negation"),
    ("What are the pros of living abroad?", "What are the cons of living abroad?", "sense"),
    ("How do I enable two-factor login?", "How do I disable two-factor login?", "sense"),
    ("How tall is the Eiffel Tower?", "How tall is the Tokyo Tower?", "name"),
    ("How much is 2 pounds in kilograms?", "How much is 2 kilograms in pounds?", "units in order"),
    ("Translate 'thank you' from German to Italian.", "Translate 'thank you' from Italian to German.", "direction"),
    ("Move my files from the laptop to the cloud.", "Move my files from the cloud to the laptop.", "direction"),
]


@pytest.mark.parametrize("a,b", AGREE)
def test_paraphrases_keeping_their_key_terms_agree(a, b):
    assert agree(a, b) and agree(b, a)


@pytest.mark.parametrize("a,b,why", DISAGREE)
def test_prompts_asking_for_another_answer_disagree(a, b, why):
    assert not agree(a, b) and not agree(b, a), why
