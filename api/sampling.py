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
from models.sampling_request import SamplingFields


async def sampling_of(body: SamplingFields, response_format: Any = None) -> Sampling:
    name = body.not_neutral()
    if name is not None:
        raise ApiError(400, f"'{name}' is not supported: only its neutral value is accepted",
                       code="unsupported_parameter", param=name)
    return Sampling(**body.sampling_values(), structured_output=await structured_output_of(response_format))


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
