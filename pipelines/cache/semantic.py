"""A semantic cache of answers, partitioned exactly before any vector search.

A lookup first names its partition: a SHA-256 of the tenant, the revision, everything
that shapes the answer besides the last user turn (system prompt, tools, response format,
every prior turn) and the sampling parameters (an omitted temperature counts as 1.0).
Only entries of that partition are searched, so embedding distance is never what keeps
tenants, system prompts or sampling settings apart. Within it, the nearest entry by
cosine similarity of the prompts' embeddings (a faiss inner-product index over unit
vectors) is a hit when it reaches the threshold: the platform's floor, or higher where a
tenant's policy raises it (never lower). An entry that close is still no hit when its
prompt and the one looked up differ in their key terms (`pipelines.cache.key_terms`: numbers,
negation, opposite senses, names, units, what a conversion goes from and to), which a
sentence embedding barely sees.

Only deterministic sampling is cacheable (temperature 0), unless the tenant's policy opts
in to caching sampled answers. Entries hold text, so they live in memory beside the
bounded-retention text, never on a durable topic. Each expires after its TTL, which is
never longer than the stream topic keeps the answers' text (`MAX_TTL_S`), so the cache
holds no text the log has let go. An invalidation (an admin event: the registry's epoch
for the tenant and alias moves on) makes every older entry of the tenant and alias dead,
and `purge_tenant` deletes a tenant's entries with its text. Entries per tenant are
bounded; the oldest go first.
"""
from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from models import topics
from models.events import canonical
from pipelines.cache.key_terms import agree

PLATFORM_FLOOR = 0.90  # the least similarity a hit may have, whatever a tenant asks for (tests/perf/RESULTS.md)
FLAT_LIMIT = 4096  # a partition searched exactly up to this many entries, by HNSW beyond
# No entry outlives the answer's text on the log: a tenant's text and its cache go together.
MAX_TTL_S = topics.STREAM.retention_ms / 1000
SEARCH_K = 8  # neighbours looked at, so a dead or expired nearest one does not hide a live one
REBUILD_DEAD_SHARE = 0.5  # an index rebuilt once this share of its entries is dead


class Embedder(Protocol):
    dim: int

    def embed(self, texts: list[str]) -> list[list[float]]: ...


def sampling_key(sampling: dict) -> dict:
    """The sampling parameters as they shape an answer: omitted ones at their defaults."""
    defaults = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "seed": None, "stop": None, "max_output_tokens": None,
                "ignore_eos": False}
    key = {name: sampling.get(name, default) if sampling.get(name) is not None else default
           for name, default in defaults.items()}
    if sampling.get("structured_output") is not None:  # an answer held to a format is another answer
        key["structured_output"] = sampling["structured_output"]
    return key


def partition_key(tenant_id: str, model_revision: str, *, context: object, sampling: dict) -> str:
    """The exact partition a prompt is cached and looked up in. `context`: all that shapes
    the answer besides the prompt embedded (system prompt, tools, response format, prior
    turns), as JSON-able data."""
    return hashlib.sha256(canonical({"v": 1, "tenant": tenant_id, "revision": model_revision, "context": context,
                                     "sampling": sampling_key(sampling)})).hexdigest()


def cacheable(sampling: dict, *, sampled_too: bool = False) -> bool:
    """Whether an answer under these sampling parameters may be cached and served again."""
    if sampling.get("logprobs") is not None:  # a cached answer has no log probabilities to give
        return False
    return sampled_too or sampling_key(sampling)["temperature"] == 0


@dataclass(frozen=True)
class Entry:
    entry_id: str
    tenant_id: str
    alias: str
    partition: str
    prompt: str
    answer: str
    output_tokens: int
    input_tokens: int
    finish_reason: str
    created_s: float
    expires_s: float
    epoch: int
    source_request_id: str | None = None


@dataclass(frozen=True)
class Lookup:
    """A lookup's outcome: the entry hit (None on a miss) and the nearest live similarity
    seen (None when the partition held nothing live), for near-miss figures."""

    entry: Entry | None
    similarity: float | None
    threshold: float


class _Partition:
    """One partition's vectors and their index (exact while small, HNSW once large)."""

    def __init__(self, dim: int):
        self.dim, self.dead = dim, 0
        self.ids: list[str] = []  # the index's row -> entry id
        self.vectors: list[np.ndarray] = []
        self.index = self._new_index(0)

    def _new_index(self, size: int):
        import faiss

        if size <= FLAT_LIMIT:
            return faiss.IndexFlatIP(self.dim)
        index = faiss.IndexHNSWFlat(self.dim, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = 64
        return index

    def add(self, entry_id: str, vector: np.ndarray) -> None:
        self.ids.append(entry_id)
        self.vectors.append(vector)
        if len(self.ids) == FLAT_LIMIT + 1:
            self.rebuild(None)  # from here on, HNSW
        else:
            self.index.add(vector.reshape(1, -1))

    def rebuild(self, live: set[str] | None) -> None:
        """A fresh index of the live entries (all, with None)."""
        keep = [(i, v) for i, v in zip(self.ids, self.vectors) if live is None or i in live]
        self.ids, self.vectors = [i for i, _ in keep], [v for _, v in keep]
        self.index = self._new_index(len(keep))
        if keep:
            self.index.add(np.stack(self.vectors))
        self.dead = 0

    def search(self, vector: np.ndarray, k: int) -> list[tuple[float, str]]:
        if not self.ids:
            return []
        scores, rows = self.index.search(vector.reshape(1, -1), min(k, len(self.ids)))
        return [(float(s), self.ids[r]) for s, r in zip(scores[0], rows[0]) if r >= 0]


class SemanticCache:
    def __init__(self, embedder: Embedder, *, floor: float = PLATFORM_FLOOR, max_entries_per_tenant: int = 100_000,
                 clock=time.monotonic, key_terms: bool = True):
        self._embedder, self.floor, self._max = embedder, floor, max_entries_per_tenant
        self._key_terms = key_terms  # whether a hit's prompt must share the key terms of the one looked up
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}  # insertion order: the oldest first
        self._partitions: dict[str, _Partition] = {}

    def threshold(self, tenant_threshold: float | None) -> float:
        """The similarity a hit needs: a tenant may raise the platform's floor, not lower it."""
        return self.floor if tenant_threshold is None else max(self.floor, tenant_threshold)

    def _vector(self, text: str) -> np.ndarray:
        return np.asarray(self._embedder.embed([text])[0], dtype="float32")

    def lookup(self, *, partition: str, prompt: str, epoch: int = 0, tenant_threshold: float | None = None,
               vector: np.ndarray | None = None) -> Lookup:
        threshold = self.threshold(tenant_threshold)
        vector = self._vector(prompt) if vector is None else vector
        now = self._clock()
        with self._lock:
            found = self._partitions.get(partition)
            if found is None:
                return Lookup(None, None, threshold)
            best = None
            for score, entry_id in found.search(vector, SEARCH_K):
                entry = self._entries.get(entry_id)
                if entry is None or entry.expires_s <= now or entry.epoch < epoch:
                    continue
                if best is None:
                    best = (score, None)  # the nearest live one, for near-miss figures
                if score < threshold:
                    break  # the results come nearest first: none further reaches it
                if not self._key_terms or agree(prompt, entry.prompt):
                    best = (score, entry)
                    break
        if best is None:
            return Lookup(None, None, threshold)
        return Lookup(best[1], min(1.0, best[0]), threshold)

    def insert(self, *, tenant_id: str, alias: str, partition: str, prompt: str, answer: str, output_tokens: int,
               input_tokens: int, finish_reason: str, ttl_s: float, epoch: int = 0,
               source_request_id: str | None = None, vector: np.ndarray | None = None) -> Entry:
        vector = self._vector(prompt) if vector is None else vector
        now = self._clock()
        entry = Entry("ce_" + uuid.uuid4().hex[:20], tenant_id, alias, partition, prompt, answer, output_tokens,
                      input_tokens, finish_reason, now, now + ttl_s, epoch, source_request_id)
        with self._lock:
            part = self._partitions.get(partition)
            if part is None:
                part = self._partitions[partition] = _Partition(len(vector))
            part.add(entry.entry_id, vector)
            self._entries[entry.entry_id] = entry
            owned = self._by_tenant.setdefault(tenant_id, OrderedDict())
            owned[entry.entry_id] = None
            while len(owned) > self._max:
                self._drop(next(iter(owned)))
        return entry

    def _drop(self, entry_id: str) -> None:
        entry = self._entries.pop(entry_id, None)
        if entry is None:
            return
        self._by_tenant.get(entry.tenant_id, {}).pop(entry_id, None)
        part = self._partitions.get(entry.partition)
        if part is None:
            return
        part.dead += 1
        live = len(part.ids) - part.dead
        if live == 0:
            del self._partitions[entry.partition]
        elif part.dead >= REBUILD_DEAD_SHARE * len(part.ids):
            part.rebuild({i for i in part.ids if i in self._entries})

    def purge_tenant(self, tenant_id: str, alias: str | None = None) -> int:
        """Deletes the tenant's entries (of one alias, or all); returns how many."""
        with self._lock:
            doomed = [e for e in self._by_tenant.get(tenant_id, {}) if alias is None
                      or self._entries[e].alias == alias]
            for entry_id in doomed:
                self._drop(entry_id)
            return len(doomed)

    def expire(self) -> int:
        """Drops the entries past their TTL; returns how many."""
        now = self._clock()
        with self._lock:
            doomed = [e.entry_id for e in self._entries.values() if e.expires_s <= now]
            for entry_id in doomed:
                self._drop(entry_id)
            return len(doomed)

    def size(self, tenant_id: str | None = None) -> int:
        with self._lock:
            return len(self._entries) if tenant_id is None else len(self._by_tenant.get(tenant_id, ()))


class HashingEmbedder:
    """A deterministic stand-in for tests: a bag of lower-cased words hashed into `dim`
    buckets, normalised. The same words in any order embed the same; no shared word, ~0."""

    def __init__(self, dim: int = 256):
        self.dim = dim

    def embed(self, texts: list[str]) -> list[list[float]]:
        out = []
        for text in texts:
            v = np.zeros(self.dim, dtype="float32")
            for word in "".join(c.lower() if c.isalnum() else " " for c in text).split():
                v[int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "big") % self.dim] += 1.0
            norm = float(np.linalg.norm(v))
            out.append((v / norm if norm else v).tolist())
        return out


@dataclass(frozen=True)
class CacheQuery:
    """One request's look at the cache: where it looks, the text it embeds (the prompt, or
    a chat's last user turn), that text's vector, and the policy in force. Kept with the
    request, so a miss can be filled with its answer under the same key."""

    tenant_id: str
    alias: str
    partition: str
    text: str
    vector: np.ndarray
    epoch: int
    threshold: float | None
    ttl_s: float


@dataclass
class CacheCounts:
    """Lookups of one tenant and alias: hits, misses, and the nearest similarity of misses
    that had a neighbour (near misses), bucketed (upper bounds of `NEAR_MISS_BUCKETS`)."""

    hits: int = 0
    misses: int = 0
    near_misses: list[int] | None = None

    def __post_init__(self) -> None:
        self.near_misses = self.near_misses or [0] * len(NEAR_MISS_BUCKETS)


NEAR_MISS_BUCKETS = (0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)


class AnswerCache:
    """The API's semantic cache: what a tenant's policy (`models.registry.CachePolicy`) lets
    it serve, looked up before a request is submitted and filled from the answers the API
    streams. The embedder is made on first use, so a platform where no tenant turned the
    cache on never loads one."""

    def __init__(self, make_embedder, *, floor: float = PLATFORM_FLOOR, max_entries_per_tenant: int = 100_000,
                 clock=time.monotonic):
        self._make_embedder, self._embedder = make_embedder, None
        self._floor, self._max, self._clock = floor, max_entries_per_tenant, clock
        self.floor = floor
        self._made = threading.Lock()
        self._cache: SemanticCache | None = None
        self.counts: dict[tuple[str, str], CacheCounts] = {}

    @property
    def cache(self) -> SemanticCache:
        with self._made:
            if self._cache is None:
                self._cache = SemanticCache(self._make_embedder(), floor=self._floor,
                                            max_entries_per_tenant=self._max, clock=self._clock)
            return self._cache

    def query(self, registry, *, tenant_id: str, alias: str, revision: str, text: str, context: object,
              sampling: dict) -> CacheQuery | None:
        """The look this request may take; None when its tenant has the cache off for the
        alias or its sampling makes answers that are not to be served again."""
        policy = registry.cache_policy(tenant_id, alias)
        if not policy.enabled or not cacheable(sampling, sampled_too=policy.sampled_too):
            return None
        cache = self.cache
        return CacheQuery(tenant_id, alias, partition_key(tenant_id, revision, context=context, sampling=sampling),
                          text, cache._vector(text), registry.cache_epoch(tenant_id, alias), policy.threshold,
                          min(float(policy.ttl_s), MAX_TTL_S))

    def find(self, q: CacheQuery) -> Lookup:
        found = self.cache.lookup(partition=q.partition, prompt=q.text, epoch=q.epoch,
                                  tenant_threshold=q.threshold, vector=q.vector)
        counts = self.counts.setdefault((q.tenant_id, q.alias), CacheCounts())
        if found.entry is not None:
            counts.hits += 1
        else:
            counts.misses += 1
            if found.similarity is not None:
                counts.near_misses[next(i for i, top in enumerate(NEAR_MISS_BUCKETS)
                                        if found.similarity <= top or top == NEAR_MISS_BUCKETS[-1])] += 1
        return found

    def fill(self, q: CacheQuery, *, answer: str, output_tokens: int, input_tokens: int, finish_reason: str,
             source_request_id: str) -> Entry:
        return self.cache.insert(tenant_id=q.tenant_id, alias=q.alias, partition=q.partition, prompt=q.text,
                                 answer=answer, output_tokens=output_tokens, input_tokens=input_tokens,
                                 finish_reason=finish_reason, ttl_s=q.ttl_s, epoch=q.epoch,
                                 source_request_id=source_request_id, vector=q.vector)

    def size(self, tenant_id: str | None = None) -> int:
        return 0 if self._cache is None else self._cache.size(tenant_id)

    def purge(self, tenant_id: str, alias: str | None = None) -> int:
        return 0 if self._cache is None else self._cache.purge_tenant(tenant_id, alias)


def embedder_for(settings):
    """A function making the embedder the settings name (loaded when first called)."""
    if settings.cache_embedder == "hashing":
        return HashingEmbedder
    from pipelines.cache.similarity import Embedder as MiniLM, model_dir

    return lambda: MiniLM(model_dir(settings.home))
