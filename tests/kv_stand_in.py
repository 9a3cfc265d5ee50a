"""The KV cache of a stand-in engine, of a size a test chooses: `capacity_tokens` in blocks
of `block_size` tokens, as vLLM allocates it. A running request holds its prompt and the
tokens made so far, rounded up to whole blocks, until it ends; nothing is ever refused or
preempted, so a test that over-commits sees more used than the capacity. A capacity of 0
is a stand-in that keeps no KV figures (the engine port's zeros), prefix-cache counts aside."""
from __future__ import annotations

import threading

from workers.engine import KvFigures


class StandInKv:
    def __init__(self, capacity_tokens: int = 0, block_size: int = 16):
        if block_size < 1 or capacity_tokens < 0 or capacity_tokens % block_size:
            raise ValueError(f"a KV capacity of whole blocks is needed: {capacity_tokens} tokens "
                             f"in blocks of {block_size}")
        self.capacity_tokens, self.block_size = capacity_tokens, block_size
        self._held: dict[str, int] = {}  # tokens of each running request
        self._queries = self._hits = 0
        self._lock = threading.Lock()  # changed on the engine's loop, read by heartbeats and scrapes

    def hold(self, request_id: str, tokens: int) -> None:
        """The request runs, holding `tokens` (its prompt, at its start)."""
        with self._lock:
            self._held[request_id] = max(0, tokens)

    def grow(self, request_id: str, tokens: int = 1) -> None:
        with self._lock:
            if request_id in self._held:
                self._held[request_id] += tokens

    def release(self, request_id: str) -> None:
        with self._lock:
            self._held.pop(request_id, None)

    def looked_up(self, queries: int, hits: int) -> None:
        """Prompt tokens looked up in a prefix cache, and those found there."""
        with self._lock:
            self._queries += queries
            self._hits += hits

    def figures(self) -> KvFigures:
        with self._lock:
            blocks = sum(-(-tokens // self.block_size) for tokens in self._held.values())
            queries, hits = self._queries, self._hits
        if not self.capacity_tokens:
            return KvFigures(prefix_cache_queries=queries, prefix_cache_hits=hits)
        used = blocks * self.block_size
        return KvFigures(capacity_tokens=self.capacity_tokens, used_tokens=used,
                         usage=min(1.0, used / self.capacity_tokens), prefix_cache_queries=queries,
                         prefix_cache_hits=hits)
