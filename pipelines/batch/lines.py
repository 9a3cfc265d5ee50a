"""One line of an OpenAI batch input file, checked: either a request we can run or an
error that names the line. Unknown body fields are ignored, as OpenAI-compatible
servers do; fields that would change what we return (n > 1, streaming, a response format)
are refused.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from models.sampling_request import SamplingFields
from models.text import MAX_JSON_DEPTH, encodable, nested_too_deep, unencodable_at


class LineError(Exception):
    def __init__(self, code: str, message: str, custom_id: str | None = None):
        super().__init__(message)
        self.code, self.message, self.custom_id = code, message, custom_id


class _Body(SamplingFields):
    """The sampling fields are checked as the interactive routes check them (the seed's
    int64 range is also what the Parquet output holds)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    stream: Literal[False] = False
    # Held output formats run on the interactive routes only: a line asking for one is
    # refused, never run as free text.
    response_format: dict | None = None


class _Part(BaseModel):
    type: Literal["text"]
    text: str


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[_Part]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatBody(_Body):
    messages: list[_Message] = Field(min_length=1)


class CompletionBody(_Body):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError("a batch line takes exactly one prompt")
            return value[0]
        return value


class _Line(BaseModel):
    model_config = ConfigDict(extra="ignore")

    custom_id: str = Field(min_length=1, max_length=512)
    method: str
    url: str
    body: dict


@dataclass(frozen=True)
class ParsedLine:
    line: int  # 1-based
    custom_id: str
    model: str
    messages: list[dict] | None  # chat
    prompt: str | None  # completions
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    ignore_eos: bool


def _first_error(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    return f"{where}: {err.get('msg', 'invalid value')}" if where else err.get("msg", "invalid value")


def parse_line(raw: bytes, line: int, endpoint: str) -> ParsedLine:
    """Raises `LineError` for anything that is not a request to `endpoint`."""
    if nested_too_deep(raw):
        raise LineError("invalid_json", f"line {line} nests arrays or objects more than {MAX_JSON_DEPTH} levels deep")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LineError("invalid_json", f"line {line} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise LineError("invalid_request", f"line {line} is not a JSON object")
    custom_id = data.get("custom_id") if isinstance(data.get("custom_id"), str) else None
    bad = unencodable_at(data)
    if bad is not None:  # as the API refuses it: it could not be written to Parquet or the log
        where = ".".join(str(p) for p in bad)
        raise LineError("invalid_request", f"line {line}: {where} holds a lone UTF-16 surrogate, which is not text",
                        custom_id if custom_id is None or encodable(custom_id) else None)
    try:
        head = _Line.model_validate(data)
    except ValidationError as exc:
        raise LineError("invalid_request", f"line {line}: {_first_error(exc)}", custom_id) from None
    if head.method.upper() != "POST":
        raise LineError("invalid_method", f"line {line}: method must be POST", custom_id)
    if head.url != endpoint:
        raise LineError("invalid_url", f"line {line}: url {head.url!r} differs from the batch's endpoint "
                        f"{endpoint!r}", custom_id)
    model = ChatBody if endpoint == "/v1/chat/completions" else CompletionBody
    try:
        body = model.model_validate(head.body)
    except ValidationError as exc:
        raise LineError("invalid_request", f"line {line}: body.{_first_error(exc)}", custom_id) from None
    unsupported = body.not_neutral()
    if unsupported is not None:
        raise LineError("invalid_request", f"line {line}: body.{unsupported} is not supported: only its neutral "
                        "value is accepted", custom_id)
    if body.response_format not in (None, {"type": "text"}):
        raise LineError("invalid_request", f"line {line}: body.response_format is not supported in a batch: only "
                        "{\"type\": \"text\"} is accepted (use /v1/chat/completions for structured outputs)", custom_id)
    for name in ("logprobs", "top_logprobs"):  # never run without what the line asked for
        if getattr(body, name) is not None and getattr(body, name) is not False:
            raise LineError("invalid_request", f"line {line}: body.{name} is not supported in a batch (use "
                            "/v1/chat/completions or /v1/completions for log probabilities)", custom_id)
    sampling = body.sampling_values()
    is_chat = isinstance(body, ChatBody)
    return ParsedLine(
        line=line, custom_id=head.custom_id, model=body.model,
        messages=[{"role": m.role, "content": m.text()} for m in body.messages] if is_chat else None,
        prompt=None if is_chat else body.prompt,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=sampling["temperature"], top_p=sampling["top_p"], seed=sampling["seed"],
        stop=list(sampling["stop"]), ignore_eos=sampling["ignore_eos"])


def request_id(batch_id: str, line: int) -> str:
    """The id of the request on an input line: stable, so a retried chunk reports the same."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{line}".encode()).hexdigest()[:24]


def error_line(batch_id: str, line: int, custom_id: str | None, code: str, message: str) -> dict:
    """One line of a batch's error file, in OpenAI's shape (plus the input line)."""
    return {"id": request_id(batch_id, line), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message, "line": line}}
