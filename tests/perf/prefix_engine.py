"""A stand-in engine with a prefix cache, for measuring placement (`bench_affinity.py`).

It keeps the KV blocks of prompts it has seen the way vLLM's prefix caching does: a prompt
is cut into blocks (`BLOCK_CHARS` characters here, for 16 tokens there), each named by a
hash chained over the tenant and every block before it, held in an LRU of
`cache_blocks`. A request's prefill costs `prefill_s_per_block` for each block past the
longest cached run from its start, one prefill at a time (prefill is compute bound on a
real engine); then it emits one token every `pause_s`. Counts of blocks found and computed
say how well placement kept prefixes where they are cached.
"""
from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from types import SimpleNamespace

from tests.slow_engine import SlowEngine
from workers.engine import EngineRequest

BLOCK_CHARS = 64
TOKENS_PER_BLOCK = 16  # what a block of BLOCK_CHARS stands for, in the prefix-cache counts


def block_hashes(tenant_id: str, prompt: str) -> list[bytes]:
    chained, hashes = tenant_id.encode(), []
    for start in range(0, len(prompt) - len(prompt) % BLOCK_CHARS, BLOCK_CHARS):
        chained = hashlib.blake2b(chained + prompt[start:start + BLOCK_CHARS].encode(), digest_size=16).digest()
        hashes.append(chained)
    return hashes


class PrefixCachedEngine(SlowEngine):
    def __init__(self, *, pause_s: float, prefill_s_per_block: float, cache_blocks: int, model_dir,
                 max_model_len: int, config_hash: str = "prefix-engine"):
        super().__init__(pause_s, config_hash)
        self.prefill_s_per_block, self.cache_blocks = prefill_s_per_block, cache_blocks
        self.config = SimpleNamespace(model=model_dir, max_model_len=max_model_len)
        self._cache: OrderedDict[bytes, None] = OrderedDict()
        self._prefill: asyncio.Lock | None = None
        self.blocks_found = self.blocks_computed = self.requests = 0

    def max_model_len(self) -> int:
        return self.config.max_model_len

    async def prefill(self, request: EngineRequest) -> None:
        self.requests += 1
        if self._prefill is None:
            self._prefill = asyncio.Lock()  # made on the engine's own loop
        hashes = block_hashes(request.tenant_id, request.prompt)
        found = 0
        for h in hashes:
            if h not in self._cache:
                break
            found += 1
        async with self._prefill:
            await asyncio.sleep((len(hashes) - found) * self.prefill_s_per_block)
        self.blocks_found += found
        self.blocks_computed += len(hashes) - found
        self.kv.looked_up(len(hashes) * TOKENS_PER_BLOCK, found * TOKENS_PER_BLOCK)
        for h in hashes:
            self._cache[h] = None
            self._cache.move_to_end(h)
        while len(self._cache) > self.cache_blocks:
            self._cache.popitem(last=False)
