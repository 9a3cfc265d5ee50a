"""Wrappers around the shared vLLM engine that change when its deltas reach a worker, so
that a test's timing holds however fast (or slow) the engine runs. Pass one to
`Platform.start_worker(engine=...)`; it runs on the shared engine's loop."""
from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import replace

from workers.engine import EngineDelta, EngineRequest, InferenceEngine, KvFigures
from workers.engine_stats import EngineStats


class WrappedEngine(InferenceEngine):
    """`inner` through the port, every part of it the inner engine's own; a wrapper
    overrides what it changes."""

    def __init__(self, inner: InferenceEngine):
        self._inner = inner

    def generate(self, request: EngineRequest):
        return self._inner.generate(request)

    async def start(self) -> None:
        await self._inner.start()

    async def abort(self, request_id: str) -> None:
        await self._inner.abort(request_id)

    async def health(self) -> bool:
        return await self._inner.health()

    def errored(self) -> bool:
        return self._inner.errored()

    def kv_figures(self) -> KvFigures:
        return self._inner.kv_figures()

    def max_model_len(self) -> int | None:
        return self._inner.max_model_len()

    def max_num_seqs(self) -> int:
        return self._inner.max_num_seqs()

    def max_logprobs(self) -> int | None:
        return self._inner.max_logprobs()

    @property
    def stats(self) -> EngineStats | None:
        return self._inner.stats

    def compute_cpus(self) -> set[int]:
        return self._inner.compute_cpus()

    def pin_to_compute_cpus(self) -> set[int]:
        return self._inner.pin_to_compute_cpus()

    def count_tokens(self, text: str) -> int:
        return self._inner.count_tokens(text)

    def engine_config_hash(self) -> str:
        return self._inner.engine_config_hash()

    def close(self) -> None:
        self._inner.close()


class ThrottledEngine(WrappedEngine):
    """The shared engine, throttled to one token every `pause_s`: a long generation then
    outlasts the test's set-up however fast the engine is. (vLLM merges the deltas a slow
    reader has not taken yet, so a delta may carry many tokens; they go out one by one.)"""

    def __init__(self, inner: InferenceEngine, pause_s: float):
        super().__init__(inner)
        self._pause_s = pause_s

    async def generate(self, request):
        async with aclosing(self._inner.generate(request)) as deltas:
            async for delta in deltas:
                for piece in self._one_by_one(delta):
                    yield piece
                    await asyncio.sleep(self._pause_s)

    @staticmethod
    def _one_by_one(delta: EngineDelta) -> list[EngineDelta]:
        n = delta.new_tokens
        if n <= 1:
            return [delta]
        size = -(-len(delta.text) // n)  # the text split evenly: only the count matters here
        return [replace(delta, text=delta.text[i * size:(i + 1) * size], new_tokens=1,
                        output_tokens=delta.output_tokens - n + i + 1, finished=delta.finished and i == n - 1,
                        finish_reason=delta.finish_reason if i == n - 1 else None) for i in range(n)]


class HeldEngine(WrappedEngine):
    """The shared engine, except that a generation's last delta waits until the request is
    aborted (at most `hold_s`). A cancel sent any time after the start then meets the
    generation still running: aborted mid-stream by vLLM, or here, holding its end. An
    abort here ends the stream as vLLM's does: a finished delta with reason 'abort'; the
    held tokens are never handed out."""

    def __init__(self, inner: InferenceEngine, hold_s: float = 60.0):
        super().__init__(inner)
        self._hold_s = hold_s
        self._aborted: dict[str, asyncio.Event] = {}
        self.held: list[str] = []  # request ids whose end was held
        self.released: list[str] = []  # held ones an abort released (the rest ran out `hold_s`)

    async def generate(self, request):
        aborted = self._aborted.setdefault(request.request_id, asyncio.Event())
        try:
            async with aclosing(self._inner.generate(request)) as deltas:
                async for delta in deltas:
                    if not delta.finished or delta.finish_reason == "abort":
                        yield delta
                        continue
                    self.held.append(request.request_id)
                    try:
                        await asyncio.wait_for(aborted.wait(), self._hold_s)
                    except asyncio.TimeoutError:
                        yield delta  # nobody aborted it: it ends as the engine ended it
                        return
                    self.released.append(request.request_id)
                    yield replace(delta, text="", new_tokens=0, output_tokens=delta.output_tokens - delta.new_tokens,
                                  finish_reason="abort")
                    return
        finally:
            self._aborted.pop(request.request_id, None)

    async def abort(self, request_id: str) -> None:
        if (aborted := self._aborted.get(request_id)) is not None:
            aborted.set()
        await self._inner.abort(request_id)
