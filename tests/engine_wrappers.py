"""Wrappers around the shared vLLM engine that change when its deltas reach a worker, so
that a test's timing holds however fast (or slow) the engine runs. Pass one to
`Platform.start_worker(engine=...)`; it runs on the shared engine's loop."""
from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import replace

from workers.engine import EngineDelta


class PacedEngine:
    """The shared engine, handing out one token every `pause_s`: a long generation then
    outlasts the test's set-up however fast the engine is. (vLLM merges the deltas a slow
    reader has not taken yet, so a delta may carry many tokens; they go out one by one.)"""

    def __init__(self, inner, pause_s: float):
        self._inner, self._pause_s = inner, pause_s

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

    def __getattr__(self, name):
        return getattr(self._inner, name)


class HeldEngine:
    """The shared engine, except that a generation's last delta waits until the request is
    aborted (at most `hold_s`). A cancel sent any time after the start then meets the
    generation still running: aborted mid-stream by vLLM, or here, holding its end. An
    abort here ends the stream as vLLM's does: a finished delta with reason 'abort'; the
    held tokens are never handed out."""

    def __init__(self, inner, hold_s: float = 60.0):
        self._inner, self._hold_s = inner, hold_s
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

    def __getattr__(self, name):
        return getattr(self._inner, name)
