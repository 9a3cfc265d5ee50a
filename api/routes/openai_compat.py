"""`POST /v1/chat/completions` and `POST /v1/completions`, as OpenAI's clients expect
them (streamed or not, `stream_options.include_usage`), on ledgerlm's generations.

A completion's `id` is its generation's id: `GET /v1/generations/{id}` and its events
work on it. Parameters OpenAI defines but ledgerlm does not do (tools, logit_bias, n > 1,
echo...) are refused with a 400 rather than silently ignored; unknown extra fields are
ignored, as vLLM's server does (they still count as the body for `Idempotency-Key`). Extensions: `deadline_ms`, `priority`, `ignore_eos`.
`response_format` (`text`, `json_object`, `json_schema`) holds the output to JSON on both
routes (`models.response_format`). `logprobs` (and chat's `top_logprobs`) ride on the
request's sampling to the engine, and come back on each token event of that request only.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.deps import GenerateDep, ServicesDep
from api.errors import ApiError
from api.live import start_generation
from api.openai_format import OpenAIShape
from api.sse import collect, failure_error, stream_response
from api.sampling import sampling_of
from models.events_generation import GenerationFailed, Sampling, TokenLogprob, TokensEmitted
from models.sampling_request import SamplingFields
from pipelines.generation.submission import SubmitGeneration

router = APIRouter()
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]
RouteTag = Annotated[str | None, Header(alias="X-Route-Tag", max_length=64)]
MaxTokens = Field(default=None, gt=0, le=1_000_000)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def as_template_input(self) -> dict:
        content = self.content if isinstance(self.content, str) or self.content is None \
            else "".join(part.text for part in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content or ""}


class _Common(SamplingFields):
    model_config = ConfigDict(extra="allow")  # kept (not used) so unsupported ones can be refused

    model: str = Field(min_length=1, max_length=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    deadline_ms: int | None = Field(default=None, gt=0, le=24 * 3600 * 1000)
    priority: Literal["high", "normal"] = "normal"
    # OpenAI's shape, checked (with its schema) by `api.sampling`, which names the part that is wrong.
    response_format: dict[str, Any] | None = None

    async def sampling(self, route: Literal["chat", "text"]) -> Sampling:
        return await sampling_of(self, self.response_format, route=route)

    def refuse_unsupported(self, names: tuple[str, ...]) -> None:
        for name in names:
            if (self.model_extra or {}).get(name):
                raise ApiError(400, f"'{name}' is not supported", code="unsupported_parameter", param=name)


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=2048)
    max_tokens: int | None = MaxTokens
    max_completion_tokens: int | None = MaxTokens


class CompletionBody(_Common):
    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, gt=0, le=1_000_000)  # OpenAI's default for completions
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=1)


_UNSUPPORTED_CHAT = ("tools", "functions", "tool_choice", "logit_bias", "audio", "prediction")
_UNSUPPORTED_TEXT = ("logit_bias", "suffix")


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatBody, principal: GenerateDep, svc: ServicesDep, request: Request,
                           idempotency_key: IdempotencyKey = None, route_tag: RouteTag = None):
    body.refuse_unsupported(_UNSUPPORTED_CHAT)
    cmd = SubmitGeneration(
        request_id=None, model_alias=body.model, prompt=None,
        messages=tuple(m.as_template_input() for m in body.messages),
        max_output_tokens=body.max_completion_tokens or body.max_tokens, deadline_ms=body.deadline_ms,
        priority=body.priority, sampling=await body.sampling("chat"), route="chat.completions", user=body.user,
        tag=route_tag)
    return await _respond(svc, principal, cmd, body, request, idempotency_key, "chat", "chatcmpl-")


@router.post("/v1/completions")
async def completions(body: CompletionBody, principal: GenerateDep, svc: ServicesDep, request: Request,
                      idempotency_key: IdempotencyKey = None, route_tag: RouteTag = None):
    body.refuse_unsupported(_UNSUPPORTED_TEXT)
    if body.echo:
        raise ApiError(400, "'echo' is not supported", code="unsupported_parameter", param="echo")
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if len(prompts) != 1:
        raise ApiError(400, "prompt: exactly one prompt per request", code="invalid_value", param="prompt")
    cmd = SubmitGeneration(
        request_id=None, model_alias=body.model, prompt=prompts[0], max_output_tokens=body.max_tokens,
        deadline_ms=body.deadline_ms, priority=body.priority, sampling=await body.sampling("text"), route="completions",
        user=body.user, tag=route_tag)
    return await _respond(svc, principal, cmd, body, request, idempotency_key, "text", "cmpl-")


async def _respond(svc, principal, cmd: SubmitGeneration, body: _Common, request: Request,
                   idempotency_key: str | None, kind: Literal["chat", "text"], prefix: str) -> Any:
    live = await start_generation(svc, principal, cmd, request=request, body=body.model_dump(mode="json"),
                                  idempotency_key=idempotency_key, id_prefix=prefix)
    asked = cmd.sampling.logprobs is not None
    shape = OpenAIShape(kind, live.request_id, body.model, int(live.first.env.occurred_at.timestamp()),
                        include_usage=bool(body.stream_options and body.stream_options.include_usage), logprobs=asked)
    if body.stream:
        return stream_response(svc, live, shape.chunks, on_timeout=shape.timeout_chunk)
    kept = _KeepingLogprobs(live)
    text, last = await collect(svc, kept, request)
    if isinstance(last.env.payload, GenerationFailed):
        raise failure_error(last.env.payload)
    return JSONResponse(shape.response(text, last.env.payload, kept.logprobs if asked else None),
                        headers={"X-Request-Id": live.request_id, **live.route_headers})


class _KeepingLogprobs:
    """A generation's live stream that keeps its tokens' log probabilities as they are read,
    for a whole answer (everything else is the stream's own)."""

    def __init__(self, live) -> None:
        self._live, self.logprobs = live, list[TokenLogprob]()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._live, name)

    async def events(self):
        async for event in self._live.events():
            if isinstance(event.env.payload, TokensEmitted) and event.env.payload.logprobs:
                self.logprobs.extend(event.env.payload.logprobs)
            yield event
