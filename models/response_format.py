"""A request's `response_format` (OpenAI's shape: `text`, `json_object`, or `json_schema`
with `name`, `schema`, `strict`), checked once for every route that takes it, and the
`StructuredOutput` its generation runs with.

A schema is checked in two steps, so a request the engine would refuse is a 400 at the door,
before anything is reserved: against its JSON Schema meta-schema (`jsonschema`), then by a
grammar compiler of the kind the engine runs (`checked_by_compiler`). `strict` is accepted
and changes nothing: the engine always holds the output to the schema.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from models.events_generation import StructuredOutput

MAX_SCHEMA_CHARS = 64 * 1024  # the schema rides on the request's events, on every topic they go to
MAX_SCHEMA_NESTING = 64  # vLLM's limit (`MAX_STRUCTURED_OUTPUT_JSON_NESTING`): it refuses a deeper schema


class InvalidResponseFormat(ValueError):
    """The response format cannot be run; the message says why."""


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_object"]


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]
_FORMAT = TypeAdapter(ResponseFormat)


def parse(value: Any) -> TextFormat | JsonObjectFormat | JsonSchemaFormat:
    """The response format a request body holds, or `InvalidResponseFormat` naming the part
    that is wrong (its path below `response_format`)."""
    try:
        return _FORMAT.validate_python(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:])  # its first part is the tag, `type`'s value
        raise InvalidResponseFormat(f"{where or 'response_format'}: {first['msg']}") from None


def _nesting(node: Any) -> int:
    level, depth = [node], 0
    while level:
        level = [c for n in level if isinstance(n, (dict, list)) for c in (n.values() if isinstance(n, dict) else n)
                 if isinstance(c, (dict, list))]
        depth += 1
        if depth > MAX_SCHEMA_NESTING:
            break
    return depth


def check_schema(schema: dict[str, Any]) -> str:
    """The schema as JSON text (keys in the client's order), once it is a valid JSON Schema
    of a size and depth the engine takes; `InvalidResponseFormat` otherwise."""
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if len(text) > MAX_SCHEMA_CHARS:
        raise InvalidResponseFormat(f"json_schema.schema: longer than {MAX_SCHEMA_CHARS} characters as JSON")
    if _nesting(schema) > MAX_SCHEMA_NESTING:
        raise InvalidResponseFormat(f"json_schema.schema: objects and arrays nest more than {MAX_SCHEMA_NESTING} deep")
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise InvalidResponseFormat(f"json_schema.schema{f' at /{where}' if where else ''}: "
                                    f"not a valid JSON Schema: {exc.message}") from None
    return text


def checked_by_compiler(schema_text: str) -> None:
    """Compiles the schema to a grammar as the engine's structured-output backend will
    (vLLM's 'auto': xgrammar, falling back to guidance). llguidance goes first: it needs no
    torch, so an API process does not load it for a schema that compiles. Only a schema
    llguidance refuses is tried on xgrammar (where installed) before it is refused."""
    try:
        import llguidance
    except ImportError:  # an API installed without the engine's libraries: the engine still checks
        return
    problem = llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("json_schema", schema_text))
    if not problem:
        return
    try:
        import xgrammar
    except ImportError:
        xgrammar = None
    if xgrammar is not None:
        try:
            xgrammar.Grammar.from_json_schema(schema_text)
            return
        except Exception:  # noqa: BLE001 - any refusal of xgrammar's; llguidance's message is the one said
            pass
    raise InvalidResponseFormat(f"json_schema.schema: the engine cannot compile it: {problem}")


def structured_output(value: Any) -> StructuredOutput | None:
    """The structured output a request's `response_format` asks for (None: free text),
    checked up to, not including, the grammar compiler; `InvalidResponseFormat` otherwise."""
    if value is None:
        return None
    fmt = parse(value)
    if isinstance(fmt, TextFormat):
        return None
    if isinstance(fmt, JsonObjectFormat):
        return StructuredOutput(kind="json_object")
    return StructuredOutput(kind="json_schema", json_schema=check_schema(fmt.json_schema.schema_))
