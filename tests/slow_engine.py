"""An engine of known speed for processes a test launches (`LEDGERLM_ENGINE_FACTORY=
tests.slow_engine:SlowEngine.from_settings`): one token every `LEDGERLM_TEST_TOKEN_PAUSE_S`
(0.1 s by default), as many as asked, no model loaded. `LEDGERLM_TEST_ENGINE_HASH` names its
config hash (a second revision of the same engine, for a rollout's candidate).

Its KV cache (`tests.kv_stand_in`) is `kv_tokens` in blocks of `block_size`
(`LEDGERLM_TEST_KV_TOKENS`, `LEDGERLM_TEST_KV_BLOCK`); a running request holds its prompt
(one token a word) and every token made so far. None by default: it then says zeros."""
from __future__ import annotations

import asyncio
import os

from tests.kv_stand_in import StandInKv
from workers.engine import EngineDelta, EngineRequest, InferenceEngine


class SlowEngine(InferenceEngine):
    def __init__(self, pause_s: float = 0.1, config_hash: str = "slow-engine", *, kv_tokens: int = 0,
                 block_size: int = 16):
        self.pause_s, self._hash = pause_s, config_hash
        self._aborted: set[str] = set()
        self.kv = StandInKv(kv_tokens, block_size)

    @classmethod
    def from_settings(cls, settings) -> "SlowEngine":
        return cls(float(os.environ.get("LEDGERLM_TEST_TOKEN_PAUSE_S", "0.1")),
                   os.environ.get("LEDGERLM_TEST_ENGINE_HASH", "slow-engine"),
                   kv_tokens=int(os.environ.get("LEDGERLM_TEST_KV_TOKENS", "0")),
                   block_size=int(os.environ.get("LEDGERLM_TEST_KV_BLOCK", "16")))

    async def generate(self, request: EngineRequest):
        # An abort was for an earlier generation of this id (its take failed, it is taken
        # again): as on vLLM, which keeps nothing of an aborted request, it starts clean.
        rid = request.request_id
        self._aborted.discard(rid)
        self.kv.hold(rid, self.count_tokens(request.prompt))
        try:
            await self.prefill(request)
            for made in range(1, request.max_output_tokens + 1):
                await asyncio.sleep(self.pause_s)
                if rid in self._aborted:
                    yield EngineDelta(rid, "", 0, made - 1, True, "abort", prompt_tokens=1)
                    return
                self.kv.grow(rid)
                last = made == request.max_output_tokens
                yield EngineDelta(rid, "x ", 1, made, last, "length" if last else None, prompt_tokens=1)
        finally:
            self.kv.release(rid)

    def kv_figures(self):
        return self.kv.figures()

    async def prefill(self, request: EngineRequest) -> None:
        """Before the first token: nothing here (a subclass may model a prompt's cost)."""

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def health(self) -> bool:
        return True

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def engine_config_hash(self) -> str:
        return self._hash

    def close(self) -> None:
        pass
