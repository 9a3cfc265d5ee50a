"""A stand-in engine that makes tokens at a set rate and costs next to nothing, so the
platform's own ceiling (API, admission, worker, log) can be measured apart from any model:
`LEDGERLM_ENGINE_FACTORY=workers.synthetic_engine:SyntheticEngine.from_settings`.

It steps the way a batching engine does: one clock for every running sequence, and at each
step every sequence gets its next token, so N streams cost one wake-up a step, not N
timers. `LEDGERLM_PACED_TOKENS_PER_S` sets each stream's rate (50 by default, a 20 ms
step), `LEDGERLM_PACED_MAX_SEQS` how many run at once (256); the rest wait their turn.
The text is one short word a token, counted back by `count_tokens`. Asked for log
probabilities, it gives each token the same made-up ones (`_LOGPROB`, with alternatives
`alt1 `, `alt2 `... each one less likely), so answers are deterministic.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections import deque

from workers.engine import EngineDelta, EngineRequest, InferenceEngine, TokenLogprob

_WORD = "tok "
_LOGPROB = -0.25
MAX_LOGPROBS = 20


def made_up_logprobs(k: int | None) -> tuple[TokenLogprob, ...] | None:
    """One token's log probabilities with `k` alternatives (the token itself likeliest)."""
    if k is None:
        return None
    top = tuple((_WORD if i == 0 else f"alt{i} ", _LOGPROB - i) for i in range(k))
    return (TokenLogprob(_WORD, _LOGPROB, top),)


class SyntheticEngine(InferenceEngine):
    """Tokens at a set pace from no model at all (what the module says)."""

    def __init__(self, tokens_per_s: float = 50.0, max_seqs: int = 256):
        if tokens_per_s <= 0 or max_seqs < 1:
            raise ValueError("a synthetic engine needs a positive token rate and at least one sequence")
        self.step_s = 1.0 / tokens_per_s
        self.max_seqs = max_seqs
        self._running: dict[str, asyncio.Future] = {}
        self._waiting: deque[tuple[str, asyncio.Future]] = deque()
        self._aborted: set[str] = set()
        self._clock: asyncio.Task | None = None
        self.steps = 0

    @classmethod
    def from_settings(cls, settings) -> "SyntheticEngine":
        return cls(float(os.environ.get("LEDGERLM_PACED_TOKENS_PER_S", "50")),
                   int(os.environ.get("LEDGERLM_PACED_MAX_SEQS", "256")))

    async def generate(self, request: EngineRequest):
        rid = request.request_id
        loop = asyncio.get_running_loop()
        if self._clock is None or self._clock.done():
            self._clock = loop.create_task(self._tick())
        try:
            if len(self._running) >= self.max_seqs:
                turn = loop.create_future()
                self._waiting.append((rid, turn))
                await turn
                if rid in self._aborted:
                    yield EngineDelta(rid, "", 0, 0, True, "abort", prompt_tokens=1)
                    return
            for made in range(1, request.max_output_tokens + 1):
                step = self._running[rid] = loop.create_future()
                await step
                if rid in self._aborted:
                    yield EngineDelta(rid, "", 0, made - 1, True, "abort", prompt_tokens=1)
                    return
                last = made == request.max_output_tokens
                yield EngineDelta(rid, _WORD, 1, made, last, "length" if last else None, prompt_tokens=1,
                                  logprobs=made_up_logprobs(request.logprobs))
        finally:
            self._running.pop(rid, None)
            self._aborted.discard(rid)
            self._admit_waiting()

    def _admit_waiting(self) -> None:
        while self._waiting and len(self._running) < self.max_seqs:
            rid, turn = self._waiting.popleft()
            if not turn.done():
                self._running[rid] = turn  # holds its seat until its first step is armed
                turn.set_result(None)

    async def _tick(self) -> None:
        """One step every `step_s` on a fixed schedule (a late step does not shift the next)."""
        due = time.monotonic()
        while True:
            due += self.step_s
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if not self._running and not self._waiting:  # idle: the next stream starts the clock again
                self._clock = None
                return
            self.steps += 1
            for step in list(self._running.values()):
                if not step.done():
                    step.set_result(None)

    async def abort(self, request_id: str) -> None:
        step = self._running.get(request_id) or next((t for r, t in self._waiting if r == request_id), None)
        if step is not None:  # unknown or finished ids are ignored
            self._aborted.add(request_id)
            if not step.done():
                step.set_result(None)

    async def health(self) -> bool:
        return True

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def engine_config_hash(self) -> str:
        return f"synthetic-{self.step_s * 1000:g}ms-{self.max_seqs}"

    def max_num_seqs(self) -> int:
        return self.max_seqs

    def max_logprobs(self) -> int:
        return MAX_LOGPROBS

    def close(self) -> None:
        if self._clock is not None:
            self._clock.cancel()
