"""`/v1/generations`: ledgerlm's own generation API, streaming over SSE.

Each SSE frame's `id:` is the event's offset in the request's stream partition, so a
client can resume with `Last-Event-ID`.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from api.deps import GenerateDep, ServicesDep
from api.errors import ApiError
from api.stream_hub import StreamEvent
from models import topics
from models.events import new_event
from models.events_generation import (
    CancelRequested, GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationRejected,
    GenerationStarted, Sampling, TokensEmitted,
)
from pipelines.routing import publish
from pipelines.submission import SubmitGeneration, submit_generation

router = APIRouter()
END_TYPES = (GenerationCompleted, GenerationFailed, GenerationCancelled, GenerationRejected)


class GenerationBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    model_alias: str = Field(min_length=1, max_length=128)
    input: str = Field(max_length=1_000_000)
    max_output_tokens: int = Field(default=256, gt=0, le=1_000_000)
    deadline_ms: int | None = Field(default=None, gt=0, le=24 * 3600 * 1000)
    stream: bool = True
    priority: str = Field(default="normal", pattern="^(high|normal)$")
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    ignore_eos: bool = False


def frame(data: dict | str, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"{head}data: {body}\n\n".encode()


def event_json(event: StreamEvent) -> dict:
    p = event.env.payload
    base = {"request_id": event.env.correlation_id}
    if isinstance(p, TokensEmitted):
        return {**base, "type": "tokens", "seq": p.seq, "text": p.text, "token_count": p.token_count}
    if isinstance(p, GenerationStarted):
        return {**base, "type": "started", "model_revision": p.model_revision, "queued_ms": p.queued_ms}
    if isinstance(p, GenerationCompleted):
        return {**base, "type": "completed", "finish_reason": p.finish_reason, "model_revision": p.model_revision,
                "usage": {"input_tokens": p.input_tokens, "output_tokens": p.output_tokens},
                "timings": p.timings.model_dump()}
    if isinstance(p, GenerationCancelled):
        return {**base, "type": "cancelled", "finish_reason": "cancelled", "reason": p.reason,
                "usage": {"input_tokens": p.input_tokens, "output_tokens": p.output_tokens}}
    if isinstance(p, GenerationFailed):
        return {**base, "type": "failed", "finish_reason": "error", "error": {"code": p.error_code, "message": p.message},
                "usage": {"input_tokens": p.input_tokens, "output_tokens": p.output_tokens}}
    if isinstance(p, GenerationRejected):
        return {**base, "type": "rejected", "error": {"code": p.reason, "message": p.message},
                "retry_after_ms": p.retry_after_ms}
    return {**base, "type": event.env.event_type}


async def request_events(sub, timeout_s: float) -> AsyncIterator[StreamEvent]:
    """The request's stream events in order, until its end event or the timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise ApiError(504, "The generation did not finish in time", code="timeout")
        event = await asyncio.wait_for(sub.queue.get(), timeout=remaining)
        yield event
        if isinstance(event.env.payload, END_TYPES):
            return


@router.post("/v1/generations")
async def create_generation(body: GenerationBody, principal: GenerateDep, svc: ServicesDep, request: Request):
    request_id = body.request_id or "gen_" + uuid.uuid4().hex
    cmd = SubmitGeneration(
        request_id=request_id, model_alias=body.model_alias, prompt=body.input,
        max_output_tokens=body.max_output_tokens, deadline_ms=body.deadline_ms, priority=body.priority,
        sampling=Sampling(temperature=body.temperature, top_p=body.top_p, seed=body.seed, ignore_eos=body.ignore_eos),
    )
    registry = svc.registry_view.refresh()
    sub = svc.hub.subscribe(request_id)  # before submitting, so no event can slip past
    try:
        submitted = await asyncio.to_thread(
            submit_generation, cmd, principal=principal, registry=registry, log=svc.log, counter=svc.counter,
            default_deadline_ms=svc.settings.default_deadline_ms)
    except BaseException:
        sub.close()
        raise
    timeout_s = (body.deadline_ms or svc.settings.default_deadline_ms) / 1000 + svc.settings.grace_s
    if not body.stream:
        return await _collect(sub, request_id, timeout_s)
    return StreamingResponse(_stream(sub, svc, principal.tenant_id, request_id, request, timeout_s),
                             media_type="text/event-stream", headers={"Cache-Control": "no-store"})


async def _collect(sub, request_id: str, timeout_s: float) -> JSONResponse:
    text, last = [], None
    with sub:
        async for event in request_events(sub, timeout_s):
            if isinstance(event.env.payload, TokensEmitted):
                text.append(event.env.payload.text)
            last = event
    result = event_json(last)
    if result["type"] == "rejected":
        raise ApiError(429, result["error"]["message"], code=result["error"]["code"])
    return JSONResponse({**result, "id": request_id, "output": "".join(text)})


async def _stream(sub, svc, tenant_id: str, request_id: str, request: Request, timeout_s: float):
    ended = False
    try:
        with sub:
            async for event in request_events(sub, timeout_s):
                ended = isinstance(event.env.payload, END_TYPES)
                yield frame(event_json(event), event.offset)
        yield frame("[DONE]")
    finally:
        if not ended:
            # The client went away (or we timed out) before the end: stop the work.
            env = new_event(CancelRequested(request_id=request_id, reason="client_gone"),
                            tenant_id=tenant_id, correlation_id=request_id)
            await asyncio.to_thread(publish, svc.log, topics.REQUESTS, [env])
