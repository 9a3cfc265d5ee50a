"""`/v1/generations`: ledgerlm's own generation API. Create (streamed over SSE or
collected), read its status, cancel it. Its event stream is in `api.routes.streams`."""
from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field

from api.deps import GenerateDep, ServicesDep
from api.errors import ApiError
from api.idempotent import once
from api.generation_status import find_status
from api.live import find_request, start_generation
from api.sse import collect, event_json, failure_error, native_frames_for, stream_response
from api.sampling import sampling_of
from models.events_generation import GenerationFailed
from models.sampling_request import SamplingFields
from pipelines.generation.submission import TERMINAL_STATUSES, SubmitGeneration, request_cancel

router = APIRouter()
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]
# A request's routing tag, which a router alias's static rules may match (`models.router`).
RouteTag = Annotated[str | None, Header(alias="X-Route-Tag", max_length=64)]


class GenerationBody(SamplingFields):
    model_config = ConfigDict(extra="forbid")

    request_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    model_alias: str = Field(min_length=1, max_length=128)
    input: str = Field(max_length=1_000_000)
    max_output_tokens: int = Field(default=256, gt=0, le=1_000_000)
    deadline_ms: int | None = Field(default=None, gt=0, le=24 * 3600 * 1000)
    stream: bool = True
    priority: Literal["high", "normal"] = "normal"
    # Who the caller's end user is, if it says: during a rollout, requests naming one user
    # stay on one revision (otherwise the tenant's application does).
    user: str | None = Field(default=None, min_length=1, max_length=256)
    # As on `/v1/chat/completions` (`models.response_format`): `json_object` or `json_schema`.
    response_format: dict[str, Any] | None = None


@router.post("/v1/generations")
async def create_generation(body: GenerationBody, principal: GenerateDep, svc: ServicesDep, request: Request,
                            idempotency_key: IdempotencyKey = None, route_tag: RouteTag = None):
    cmd = SubmitGeneration(
        request_id=body.request_id, model_alias=body.model_alias, prompt=body.input,
        max_output_tokens=body.max_output_tokens, deadline_ms=body.deadline_ms, priority=body.priority,
        sampling=await sampling_of(body, body.response_format), user=body.user, tag=route_tag,
        chosen_request_id=body.request_id,
    )
    live = await start_generation(svc, principal, cmd, request=request, body=body.model_dump(mode="json"),
                                  idempotency_key=idempotency_key, id_prefix="gen_")
    if body.stream:
        return stream_response(svc, live, native_frames_for(body.request_id))
    text, last = await collect(svc, live, request)
    if isinstance(last.env.payload, GenerationFailed):
        raise failure_error(last.env.payload)
    return JSONResponse({**event_json(last, body.request_id), "id": live.request_id, "output": text},
                        headers={"X-Request-Id": live.request_id, **live.route_headers})


@router.get("/v1/generations/{request_id}")
async def get_generation(request_id: str, principal: GenerateDep, svc: ServicesDep, request: Request):
    status = await asyncio.to_thread(find_status, svc, request, principal.tenant_id, request_id)
    if status is None:
        raise _not_found(request_id)
    return status


@router.post("/v1/generations/{request_id}/cancel")
async def cancel_generation(request_id: str, principal: GenerateDep, svc: ServicesDep, request: Request,
                            idempotency_key: IdempotencyKey = None):
    return await once(request, svc, principal.tenant_id, idempotency_key, route="generations.cancel",
                      body={"request_id": request_id}, run=lambda: _cancel(request_id, principal, svc, request))


async def _cancel(request_id: str, principal, svc, request: Request) -> dict:
    info = await asyncio.to_thread(find_request, svc, principal.tenant_id, request_id)
    if info is None:
        raise _not_found(request_id)
    await asyncio.to_thread(request_cancel, principal.tenant_id, info.request_id, log=svc.log,
                            known_status=svc.index.known_status(principal.tenant_id, info.request_id))
    status = await asyncio.to_thread(find_status, svc, request, principal.tenant_id, info.request_id)
    if status["status"] in TERMINAL_STATUSES:
        return status  # it was over already: cancelling changed nothing
    return {**status, "status": "cancelling"}


def _not_found(request_id: str) -> ApiError:
    # The same answer for another tenant's generation as for one that never existed.
    return ApiError(404, f"No generation '{request_id}'", code="not_found", param="id")
