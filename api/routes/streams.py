"""`GET /v1/generations/{id}/events`: a generation's stream as SSE, from its start or
resumed after `Last-Event-ID`, for as long as the stream topic retains it.

Frames are those of `POST /v1/generations` (whatever route created the generation),
with the same ids, so a client resumes exactly where it stopped: no gap, no repeat.
A reader leaving does not cancel the generation; only its creator's disconnect does.
"""
from __future__ import annotations

import asyncio
import re
from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import StreamingResponse

from api.deps import GenerateDep, ServicesDep
from api.errors import ApiError
from api.live import find_request, open_stream, wait_s_for
from api.request_stream import RequestStream, StreamTimeout
from api.sse import DONE, SSE_HEADERS, frame, event_json, timeout_frame

router = APIRouter()
_EVENT_ID = re.compile(r"^[0-9]{1,18}$")


def parse_last_event_id(value: str | None) -> int | None:
    if value is None:
        return None
    if not _EVENT_ID.match(value.strip()):
        raise ApiError(400, "Last-Event-ID must be the id of an event of this stream (a non-negative integer)",
                       code="invalid_last_event_id", param="Last-Event-ID")
    return int(value)


@router.get("/v1/generations/{request_id}/events")
async def generation_events(request_id: str, principal: GenerateDep, svc: ServicesDep,
                            last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None):
    after = parse_last_event_id(last_event_id)
    info = await asyncio.to_thread(find_request, svc, principal.tenant_id, request_id)
    if info is None:
        raise ApiError(404, f"No generation '{request_id}'", code="not_found", param="id")
    stream = await open_stream(svc, info, after=after)
    return StreamingResponse(_frames(stream, after, wait_s_for(svc, info), info.chosen_request_id),
                             media_type="text/event-stream",
                             headers={**SSE_HEADERS, "X-Request-Id": info.request_id})


async def _frames(stream: RequestStream, after: int | None, wait_s: float, chosen_request_id: str | None):
    try:
        async for event in stream.events(wait_s):
            burst = [event, *stream.ready()]  # history comes in bursts: one write each
            chunks = [frame(event_json(e, chosen_request_id), e.offset)
                      for e in burst if after is None or e.offset > after]
            if chunks:
                yield b"".join(chunks)
    except StreamTimeout:
        yield timeout_frame()
    finally:
        stream.close()
    yield DONE
