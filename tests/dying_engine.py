"""A fake engine that dies on cue, in the ways a vLLM engine does: its health call turns
false, its own errored state turns true and fails every running stream (its EngineCore
process died), or it stops answering at all."""
from __future__ import annotations

import asyncio
from pathlib import Path

from tests.fake_engine import FakeEngine
from workers.engine import EngineDelta, EngineError


class DyingEngine(FakeEngine):
    """Like `FakeEngine` (with `hold`, a stream waits until aborted), until it dies."""

    def __init__(self, hold: bool = True):
        super().__init__(hold)
        self.healthy = True
        self.vllm_dead = False  # what AsyncLLM.errored says
        self.silent = False  # health calls never answer
        self.health_calls = 0
        self._deaths: set[asyncio.Event] = set()  # one per stream waiting, set by `crash`

    async def generate(self, request):
        if self.vllm_dead:
            raise EngineError("EngineDeadError: the engine core is gone")
        if not self.hold:
            async for delta in super().generate(request):
                yield delta
            return
        self.started.append(request.request_id)
        aborted = self._aborted[request.request_id] = asyncio.Event()
        death = asyncio.Event()
        self._deaths.add(death)
        try:
            await _first(aborted.wait(), death.wait())
        finally:
            self._deaths.discard(death)
        if death.is_set():  # as vLLM's output handler fails every request of a dead core
            raise EngineError("EngineDeadError: the engine core is gone")
        yield EngineDelta(request.request_id, "", 0, 0, True, "abort")

    async def health(self):
        self.health_calls += 1
        if self.silent:
            await asyncio.Event().wait()
        return self.healthy

    def errored(self):
        return self.vllm_dead

    async def crash(self) -> None:
        """On the engine's loop: the EngineCore process died."""
        self.vllm_dead = True
        for death in list(self._deaths):
            death.set()


async def _first(*waits):
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        return await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


class MarkedEngine(DyingEngine):
    """For `serve worker` in a process of its own (`LEDGERLM_ENGINE_FACTORY` names
    `from_settings`): serves at once, and its health call turns false once the file
    `engine-dies` appears in the platform's home."""

    def __init__(self, marker: Path):
        super().__init__(hold=False)
        self.marker = marker

    @classmethod
    def from_settings(cls, settings) -> MarkedEngine:
        return cls(Path(settings.home) / "engine-dies")

    async def health(self):
        return await super().health() and not self.marker.exists()


async def wedge(release) -> None:
    """On an engine's loop: blocks it until `release` (a threading.Event) is set, as a
    wedged engine would; nothing else runs there meanwhile."""
    release.wait(120)
