"""A request's sampling fields (`models.sampling_request`, checked by every route that
takes them) as the `Sampling` its generation runs with."""
from __future__ import annotations

from api.errors import ApiError
from models.events_generation import Sampling
from models.sampling_request import SamplingFields


def sampling_of(body: SamplingFields) -> Sampling:
    name = body.not_neutral()
    if name is not None:
        raise ApiError(400, f"'{name}' is not supported: only its neutral value is accepted",
                       code="unsupported_parameter", param=name)
    return Sampling(**body.sampling_values())
