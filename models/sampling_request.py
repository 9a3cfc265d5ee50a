"""The sampling fields a request may carry, checked once for every route that takes them
(`/v1/generations`, `/v1/chat/completions`, `/v1/completions`, batch input lines).

The ranges are those vLLM's `SamplingParams._verify_args` enforces (and its OpenAI
server's int64 `seed`), so a value the engine would refuse is a 400 naming the field at
the door, never a 500 `engine_error` after the request was admitted. Fields vLLM knows
but ledgerlm does not pass on (top_k, min_p, the penalties) are range-checked the same
way and then accepted only at their neutral value: a request is never silently run with
a setting it did not get.
"""
from __future__ import annotations

import math
from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # vLLM's OpenAI server: the engine's generator takes an int64
MAX_STOP = 4  # OpenAI's limit, which ledgerlm keeps


def _stops(value):
    stops = [value] if isinstance(value, str) else list(value)
    if len(stops) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop sequences")
    if any(not s for s in stops):
        raise ValueError("a stop sequence cannot be empty")
    return value


Temperature = Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
Seed = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)]
Stop = Annotated[str | list[str], AfterValidator(_stops)]
TopK = Annotated[int, Field(ge=-1)]  # 0 and -1 both mean 'off'
MinP = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]
RepetitionPenalty = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
N = Annotated[int, Field(ge=1, le=1)]  # one choice per request

# Accepted, but only at the value that changes nothing.
NEUTRAL = {"top_k": (0, -1), "min_p": (0.0,), "presence_penalty": (0.0,), "frequency_penalty": (0.0,),
           "repetition_penalty": (1.0,)}


class SamplingFields(BaseModel):
    """A request body's sampling fields. None: the route's default."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    n: N = 1
    top_k: TopK | None = None
    min_p: MinP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool = False  # vLLM's extension, handy for fixed-length benchmarks

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def not_neutral(self) -> str | None:
        """The first field given a value ledgerlm does not apply, or None."""
        for name, neutral in NEUTRAL.items():
            value = getattr(self, name)
            if value is not None and not any(math.isclose(value, n) for n in neutral):
                return name
        return None

    def sampling_values(self) -> dict:
        """What the engine gets: temperature, top_p, seed, stop, ignore_eos, defaults filled."""
        return {"temperature": 1.0 if self.temperature is None else self.temperature,
                "top_p": 1.0 if self.top_p is None else self.top_p, "seed": self.seed, "stop": self.stops(),
                "ignore_eos": self.ignore_eos}
