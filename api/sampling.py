"""A request's sampling fields (`models.sampling_request`, checked by every route that
takes them) and its `response_format` (`models.response_format`) as the `Sampling` its
generation runs with. Everything is checked here, before the request is submitted, so a
setting the engine would refuse is a 400 with nothing reserved."""
from __future__ import annotations

import asyncio
from typing import Any

from api.errors import ApiError
from models.events_generation import Sampling, StructuredOutput
from models.response_format import InvalidResponseFormat, checked_by_compiler, structured_output
from models.sampling_request import MAX_TOP_LOGPROBS, SamplingFields

# The most alternatives a token's log probability comes with on the engines ledgerlm runs
# (vLLM's `max_logprobs`, left at its default): more is refused here, before any reservation.
ENGINE_MAX_LOGPROBS = MAX_TOP_LOGPROBS


async def sampling_of(body: SamplingFields, response_format: Any = None, *, route: str | None = None) -> Sampling:
    """`route` ('chat' or 'text') says how the body asks for log probabilities; a route that
    returns none (None) refuses a body that asks for them."""
    name = body.not_neutral()
    if name is not None:
        raise ApiError(400, f"'{name}' is not supported: only its neutral value is accepted",
                       code="unsupported_parameter", param=name)
    return Sampling(**body.sampling_values(), structured_output=await structured_output_of(response_format),
                    logprobs=logprobs_of(body, route))


def logprobs_of(body: SamplingFields, route: str | None) -> int | None:
    if route is None:
        for name in ("logprobs", "top_logprobs"):
            if getattr(body, name) is not None and getattr(body, name) is not False:  # 0 asks too
                raise ApiError(400, f"'{name}' is not supported on this route (use /v1/chat/completions or "
                               "/v1/completions)", code="unsupported_parameter", param=name)
        return None
    try:
        k = body.logprobs_asked(route)
    except ValueError as exc:
        name = str(exc).split(":", 1)[0]
        raise ApiError(400, str(exc), code="invalid_value", param=name) from None
    if k is not None and k > ENGINE_MAX_LOGPROBS:
        name = "top_logprobs" if route == "chat" else "logprobs"
        raise ApiError(400, f"{name}: the engine gives at most {ENGINE_MAX_LOGPROBS}", code="invalid_value",
                       param=name)
    return k


async def structured_output_of(response_format: Any) -> StructuredOutput | None:
    """The checked structured output of a `response_format` (None: free text). The grammar
    compiler runs off the event loop: a large schema takes it a while."""
    try:
        spec = structured_output(response_format)
        if spec is not None and spec.json_schema is not None:
            await asyncio.to_thread(checked_by_compiler, spec.json_schema)
    except InvalidResponseFormat as exc:
        raise ApiError(400, f"response_format: {exc}", code="invalid_value", param="response_format") from None
    return spec
