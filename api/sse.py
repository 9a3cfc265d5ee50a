"""Sending a live generation to its client: as server-sent events, or collected into one
response. Both hand the generation to the disconnect reaper when the client leaves early.

Each frame's `id:` is the event's offset in the request's stream partition, so a client
can resume with `Last-Event-ID` (see `api.routes.streams`).
"""
from __future__ import annotations

import json
from typing import AsyncIterator, Callable, Iterable

from fastapi import Request
from fastapi.responses import StreamingResponse

from api.deps import Services
from api.disconnect import unless_gone
from api.errors import ApiError, ClientGone
from api.live import Live
from api.request_stream import StreamTimeout
from api.stream_hub import StreamEvent
from models.events_generation import (
    CacheHit, GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationRejected, GenerationStarted,
    TokensEmitted,
)

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
_TIMEOUT = {"code": "timeout", "message": "The generation did not finish before its deadline"}


def frame(data: dict | str, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"{head}data: {body}\n\n".encode()


def event_json(event: StreamEvent, chosen_request_id: str | None = None) -> dict:
    """ledgerlm's own frame for a stream event (`/v1/generations` and `.../events`). `id` is
    the generation's id; `request_id` echoes the one its client chose, or is that id too."""
    p = event.env.payload
    base = {"id": event.env.correlation_id, "request_id": chosen_request_id or event.env.correlation_id}
    if isinstance(p, TokensEmitted):
        return {**base, "type": "tokens", "seq": p.seq, "text": p.text, "token_count": p.token_count}
    if isinstance(p, GenerationStarted):
        return {**base, "type": "started", "model_revision": p.model_revision, "queued_ms": p.queued_ms}
    if isinstance(p, CacheHit):  # admission accepted an answer from the semantic cache
        return {**base, "type": "started", "model_revision": p.model_revision, "queued_ms": 0, "cached": True}
    if isinstance(p, GenerationCompleted):
        usage = {"input_tokens": p.input_tokens, "output_tokens": p.output_tokens}
        return {**base, "type": "completed", "finish_reason": p.finish_reason, "model_revision": p.model_revision,
                "usage": {**usage, "cached": True} if p.cached else usage, "timings": p.timings.model_dump()}
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


def native_frames_for(chosen_request_id: str | None) -> Callable[[StreamEvent], list[bytes]]:
    """ledgerlm's own frames, echoing the request_id a client chose (None: it chose none)."""
    return lambda event: [frame(event_json(event, chosen_request_id), event.offset)]


def timeout_frame() -> bytes:
    return frame({"type": "failed", "finish_reason": "error", "error": _TIMEOUT})


def stream_response(svc: Services, live: Live, render: Callable[[StreamEvent], Iterable[bytes]], *,
                    on_timeout: Callable[[], bytes] = timeout_frame) -> StreamingResponse:
    return StreamingResponse(_frames(svc, live, render, on_timeout), media_type="text/event-stream",
                             headers={**SSE_HEADERS, "X-Request-Id": live.request_id, **live.route_headers})


async def _frames(svc: Services, live: Live, render, on_timeout) -> AsyncIterator[bytes]:
    done = False
    try:
        async for event in live.events():
            chunks = [*render(event)]
            for more in live.stream.ready():  # a burst goes out as one write
                chunks += render(more)
            if live.stream.ended:  # and the end with its [DONE]
                chunks.append(DONE)
                done = True
            if chunks:
                yield b"".join(chunks)
    except StreamTimeout:
        yield on_timeout()
    finally:
        # Runs on a disconnect too (the task is being cancelled): nothing here may await.
        if live.stream.ended:
            live.stream.close()
        else:
            svc.reaper.client_gone(live.stream)
    if not done:
        yield DONE


async def collect(svc: Services, live: Live, request: Request) -> tuple[str, StreamEvent]:
    """The generation's whole text and its end event, waiting while the client stays."""
    async def gather() -> tuple[str, StreamEvent]:
        text, last = [], live.first
        async for event in live.events():
            if isinstance(event.env.payload, TokensEmitted):
                text.append(event.env.payload.text)
            last = event
        return "".join(text), last

    try:
        result = await unless_gone(gather(), request)
    except ClientGone:
        svc.reaper.client_gone(live.stream, delivered=0)  # its answer was never sent
        raise
    except StreamTimeout:
        svc.reaper.client_gone(live.stream)
        raise ApiError(504, _TIMEOUT["message"], code="timeout") from None
    live.stream.close()
    return result


def failure_error(failed: GenerationFailed) -> ApiError:
    """A generation that failed after admission, as the error of a non-streamed response."""
    if failed.error_code in ("expired", "deadline_expired"):
        return ApiError(504, failed.message, code=failed.error_code)
    if failed.error_code in ("engine_dead", "worker_lost"):
        # The worker went away, not the request: another worker may serve it if sent again.
        return ApiError(503, "The worker serving this generation went away; send it again",
                        code=failed.error_code, headers={"Retry-After": "1"})
    return ApiError(500, "The generation failed", code=failed.error_code)
