"""`response_format` checked at the door: OpenAI's shapes become the structured output a
generation runs with, and a format the engine would refuse is an error naming its part."""
from __future__ import annotations

import asyncio
import json

import pytest

from api.errors import ApiError
from api.sampling import sampling_of, structured_output_of
from models.events import decode, encode
from models.events_generation import Sampling, StructuredOutput
from models.response_format import (
    MAX_SCHEMA_CHARS, MAX_SCHEMA_NESTING, InvalidResponseFormat, checked_by_compiler, structured_output,
)
from models.sampling_request import SamplingFields
from tests.golden.samples import HERE

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}


def schema_format(schema, **spec) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, **spec}}


def test_text_and_no_format_are_free_text():
    assert structured_output(None) is None
    assert structured_output({"type": "text"}) is None


def test_json_object_asks_for_any_json_object():
    assert structured_output({"type": "json_object"}) == StructuredOutput(kind="json_object")


def test_a_json_schema_is_kept_as_compact_json_in_the_client_s_key_order():
    spec = structured_output(schema_format(PERSON, strict=True, description="who"))
    assert spec.kind == "json_schema"
    assert spec.json_schema == json.dumps(PERSON, separators=(",", ":"))
    assert list(json.loads(spec.json_schema)["properties"]) == ["name", "age"]
    checked_by_compiler(spec.json_schema)  # the engine's compiler takes it


@pytest.mark.parametrize("value, says", [
    ("json", "response_format: Input should be a valid dictionary"),
    ({"type": "xml"}, "does not match any of the expected tags"),
    ({"type": "json_schema"}, "json_schema: Field required"),
    ({"type": "json_schema", "json_schema": {"name": "p"}}, "json_schema.schema: Field required"),
    ({"type": "json_schema", "json_schema": {"name": "has space", "schema": {}}}, "name: String should match"),
    ({"type": "json_schema", "json_schema": {"name": "p", "schema": "{}"}}, "json_schema.schema: Input should be"),
    ({"type": "json_object", "schema": {}}, "schema: Extra inputs are not permitted"),
    (schema_format({"type": "nonsense"}), "json_schema.schema at /type: not a valid JSON Schema"),
    (schema_format({"type": "object", "properties": {"a": {"minLength": -1}}}),
     "json_schema.schema at /properties/a/minLength: not a valid JSON Schema"),
    (schema_format({"type": "object", "required": "name"}), "json_schema.schema at /required"),
])
def test_a_malformed_format_or_invalid_schema_is_refused_naming_its_part(value, says):
    with pytest.raises(InvalidResponseFormat) as caught:
        structured_output(value)
    assert says in str(caught.value)


def test_a_schema_too_deep_or_too_long_for_the_engine_is_refused():
    deep: dict = {"type": "string"}
    for _ in range(MAX_SCHEMA_NESTING):
        deep = {"type": "array", "items": deep}
    with pytest.raises(InvalidResponseFormat, match="nest more than"):
        structured_output(schema_format(deep))
    long = {"type": "string", "enum": ["x" * 1000] * (MAX_SCHEMA_CHARS // 1000 + 1)}
    with pytest.raises(InvalidResponseFormat, match="longer than"):
        structured_output(schema_format(long))


def test_a_valid_json_schema_the_engine_cannot_compile_is_refused_by_the_compiler_check():
    dangling = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    spec = structured_output(schema_format(dangling))  # the meta-schema does not follow references
    with pytest.raises(InvalidResponseFormat, match="the engine cannot compile it"):
        checked_by_compiler(spec.json_schema)


def test_the_api_check_is_a_400_on_response_format_and_a_good_one_reaches_the_sampling():
    with pytest.raises(ApiError) as caught:
        asyncio.run(structured_output_of(schema_format({"type": "object", "properties": {"a": {"$ref": "#/x"}}})))
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, "invalid_value", "response_format")
    assert caught.value.message.startswith("response_format: json_schema.schema: the engine cannot compile it")
    sampling = asyncio.run(sampling_of(SamplingFields(temperature=0), schema_format(PERSON)))
    assert sampling.temperature == 0 and sampling.structured_output.kind == "json_schema"
    assert asyncio.run(sampling_of(SamplingFields(), {"type": "text"})) == Sampling()


def test_a_structured_output_has_its_schema_exactly_when_its_kind_says_so():
    with pytest.raises(ValueError, match="json_schema"):
        StructuredOutput(kind="json_schema")
    with pytest.raises(ValueError, match="json_schema"):
        StructuredOutput(kind="json_object", json_schema="{}")


def test_free_text_sampling_encodes_as_before_and_a_structured_one_round_trips():
    assert "structured_output" not in Sampling().model_dump_json()
    spec = structured_output(schema_format(PERSON))
    sampling = Sampling(structured_output=spec)
    assert Sampling.model_validate_json(sampling.model_dump_json()) == sampling
    raw = (HERE / "GenerationRequested.v1.structured.json").read_bytes().strip()
    assert encode(decode(raw)) == raw
    assert decode(raw).payload.sampling.structured_output.kind == "json_schema"
