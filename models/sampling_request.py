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
MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat, and vLLM's default `max_logprobs`
MAX_TEXT_LOGPROBS = 5  # OpenAI's limit for completions' `logprobs`


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
    # Chat: `logprobs` a boolean and `top_logprobs` the alternatives; completions: `logprobs`
    # the alternatives. Read by each route's own rule (`logprobs_asked`). Left out of a body's
    # dump when not given, so a body's hash (`Idempotency-Key`) is what it was before them.
    logprobs: bool | int | None = Field(default=None, exclude_if=lambda v: v is None)
    top_logprobs: int | None = Field(default=None, exclude_if=lambda v: v is None)

    def logprobs_asked(self, route: str) -> int | None:
        """The alternatives per token a request asks for (None: no log probabilities), by
        the rule of its route ('chat' or 'text'); `ValueError` naming the field otherwise."""
        lp, top = self.logprobs, self.top_logprobs
        if route == "chat":
            if lp is not None and not isinstance(lp, bool):
                raise ValueError("logprobs: must be true or false")
            if top is not None and lp is not True:
                raise ValueError("top_logprobs: only with logprobs set to true")
            if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
                raise ValueError(f"top_logprobs: must be from 0 to {MAX_TOP_LOGPROBS}")
            return (top or 0) if lp else None
        if top is not None:
            raise ValueError("top_logprobs: not a field of this route (logprobs takes the number)")
        if lp is None:
            return None
        if isinstance(lp, bool) or not 0 <= lp <= MAX_TEXT_LOGPROBS:
            raise ValueError(f"logprobs: must be an integer from 0 to {MAX_TEXT_LOGPROBS}")
        return lp

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
