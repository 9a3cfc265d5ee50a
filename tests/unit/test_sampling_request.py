"""The sampling fields every route shares: vLLM's ranges, refused with the field named."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from models.sampling_request import SEED_MAX, SEED_MIN, SamplingFields
from pipelines.batch.lines import LineError, parse_line

BAD = [
    ("stop", ""), ("stop", [""]), ("stop", ["a", ""]), ("stop", ["a", "b", "c", "d", "e"]),
    ("seed", SEED_MAX + 1), ("seed", 2**64), ("seed", SEED_MIN - 1),
    ("temperature", -0.1), ("temperature", 2.01), ("temperature", float("nan")), ("temperature", float("inf")),
    ("top_p", 0), ("top_p", 1.01), ("top_k", -2), ("min_p", 1.5), ("presence_penalty", 2.5),
    ("frequency_penalty", -2.5), ("repetition_penalty", 0), ("n", 2), ("n", 0),
]


@pytest.mark.parametrize("field,value", BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_values_vllm_refuses_are_refused_naming_the_field(field, value):
    with pytest.raises(ValidationError) as raised:
        SamplingFields.model_validate({field: value})
    assert raised.value.errors()[0]["loc"][0] == field


def test_values_vllm_takes_are_taken():
    body = SamplingFields.model_validate({"stop": ["a", "b", "c", "d"], "seed": SEED_MAX, "temperature": 0,
                                          "top_p": 1, "top_k": -1, "min_p": 0, "presence_penalty": 0})
    assert body.not_neutral() is None
    assert body.sampling_values() == {"temperature": 0, "top_p": 1, "seed": SEED_MAX, "stop": ("a", "b", "c", "d"),
                                      "ignore_eos": False}
    assert SamplingFields.model_validate({"seed": SEED_MIN}).seed == SEED_MIN
    assert SamplingFields().sampling_values()["temperature"] == 1.0


@pytest.mark.parametrize("field,value", [("top_k", 5), ("min_p", 0.1), ("presence_penalty", 0.5),
                                         ("frequency_penalty", -1), ("repetition_penalty", 1.2)])
def test_settings_not_applied_are_named_rather_than_ignored(field, value):
    assert SamplingFields.model_validate({field: value}).not_neutral() == field


def _line(body: dict) -> bytes:
    import json
    return json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "tiny", "messages": [{"role": "user", "content": "x"}], **body}}).encode()


@pytest.mark.parametrize("body,field", [({"stop": ""}, "stop"), ({"stop": [""]}, "stop"), ({"seed": 2**64}, "seed"),
                                        ({"top_k": 3}, "top_k")])
def test_batch_lines_are_checked_by_the_same_rules(body, field):
    with pytest.raises(LineError) as raised:
        parse_line(_line(body), 1, "/v1/chat/completions")
    assert f"body.{field}" in raised.value.message


def test_a_batch_line_gets_the_same_defaults():
    parsed = parse_line(_line({"stop": "\n"}), 1, "/v1/chat/completions")
    assert (parsed.temperature, parsed.top_p, parsed.seed, parsed.stop) == (1.0, 1.0, None, ["\n"])


def test_a_batch_line_with_a_lone_surrogate_is_an_error_line_not_a_crash():
    with pytest.raises(LineError) as raised:
        parse_line(_line({"stop": ["\udfff"]}), 3, "/v1/chat/completions")
    assert "line 3: body.stop.0" in raised.value.message and raised.value.custom_id == "c"
