"""The `InferenceEngine` port: where tokens are made. Workers and tests depend on this,
never on vLLM; `workers.vllm_engine.VllmEngine` is the adapter. Everything a worker asks of
an engine is declared here, with a default where a stand-in has nothing of its own to say,
so no caller looks an engine's attributes up by name."""
from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from workers.engine_stats import EngineStats

# 'abort' ends a stream cut short by `abort()` or by the caller walking away.
FinishReason = Literal["stop", "length", "abort"]

# The sequences a worker runs at once on an engine with no limit of its own (a stand-in).
DEFAULT_MAX_SEQS = 8


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    prompt: str
    max_output_tokens: int
    tenant_id: str  # salts the prefix cache, so no tenant reuses another's KV blocks
    priority: int = 0  # lower runs sooner (vLLM's convention)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # Structured output: the text is JSON matching this schema (JSON text), or with
    # `json_object`, any JSON object. An engine that cannot hold output to it refuses the request.
    json_schema: str | None = None
    json_object: bool = False
    # Log probabilities: each new token's, with this many likeliest alternatives (0: its own
    # only); None: none asked, and the deltas carry none. Only sent to an engine whose
    # `max_logprobs()` covers it.
    logprobs: int | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A new token's text and log probability (<= 0), and its likeliest alternatives as
    (text, log probability) pairs, likeliest first."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class EngineDelta:
    """One step of a stream. Token counts are what accounting settles on: `output_tokens`
    is the running total, and the final delta's total is the request's output usage."""

    request_id: str
    text: str
    new_tokens: int
    output_tokens: int
    finished: bool
    finish_reason: FinishReason | None
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    # For a request that asked for them: one entry per new token, in order; None otherwise.
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True, slots=True)
class KvFigures:
    """The engine's KV cache as it allocated it, and what it did with it. Zero where the
    engine does not know (a stand-in without a cache, or one not started yet).

    `used_tokens` counts whole blocks held by running requests; `preemptions` and the
    prefix-cache counts are running totals since the engine started: prompt tokens looked
    up in the prefix cache, and those found there. A request holds whole blocks of
    `block_tokens` (0: not said), and `reserved_tokens` of the capacity are the engine's own,
    held by no request (vLLM's null block), so what fits is judged in both."""

    capacity_tokens: int = 0
    used_tokens: int = 0
    usage: float = 0.0  # of the blocks requests can hold, 0..1
    preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    block_tokens: int = 0
    reserved_tokens: int = 0


class EngineError(Exception):
    """The engine could not serve a request (dead, overloaded, or failed mid-stream)."""


class EngineDead(EngineError):
    """The engine is gone (its process died, or it stopped answering): nothing more runs on
    it. A worker's running generations fail with it (`engine_dead`), and the worker leaves."""


class EngineMismatch(Exception):
    """A worker's engine would not produce the revision it was asked to serve (its config
    hash differs from the approved one); retrying cannot help."""


class InvalidEngineRequest(EngineError):
    """The request itself is unacceptable (e.g. prompt longer than the model allows);
    retrying it unchanged fails again."""


class InferenceEngine(abc.ABC):
    """Async and bound to one event loop (see `workers.engine_runner.EngineRunner`).
    `start()` and `close()` run on that loop's thread."""

    # What the engine says of its own steps (vLLM's: KV-cache usage, waiting requests,
    # preemptions, step times), kept for the worker's metrics; None for an engine that keeps
    # none, whose metrics then leave those series out. Read from any thread.
    stats: EngineStats | None = None

    async def start(self) -> None:
        """Bring the engine up; a no-op for engines that need no start."""

    @abc.abstractmethod
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineDelta]:
        """Stream deltas until one has `finished=True`. Closing the iterator early
        aborts the request."""

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """End the request's stream promptly with finish_reason 'abort'; unknown or
        finished ids are ignored."""

    @abc.abstractmethod
    async def health(self) -> bool: ...

    def errored(self) -> bool:
        """The engine's own word that it died (vLLM's errored state), readable from any
        thread without a call on its loop. An engine with no such state says False."""
        return False

    def kv_figures(self) -> KvFigures:
        """The KV cache's size and use now; readable from any thread (the fleet heartbeat
        and the metrics scrape read it). An engine that keeps no such figures says zeros."""
        return KvFigures()

    def max_model_len(self) -> int | None:
        """The longest sequence, prompt and output together, the engine holds; None for an
        engine with no limit of its own."""
        return None

    def max_logprobs(self) -> int | None:
        """The most alternatives per token the engine gives with its log probabilities
        (vLLM's `max_logprobs`); None for an engine that gives none, to which no request
        asking for them is sent (the worker fails it as an invalid request)."""
        return None

    def max_num_seqs(self) -> int:
        """The sequences the engine runs at once (vLLM's max_num_seqs), always at least one:
        a worker's slots unless it is told otherwise. An engine with no limit of its own
        says `DEFAULT_MAX_SEQS`."""
        return DEFAULT_MAX_SEQS

    def compute_cpus(self) -> set[int]:
        """The CPUs the engine bound its compute threads to, for the worker to keep its own
        threads off; empty for an engine that binds none (or is not started)."""
        return set()

    def pin_to_compute_cpus(self) -> set[int]:
        """Moves the rest of the engine's processes onto `compute_cpus()`; returns the CPUs
        they run on now (empty: nothing bound, so nothing moved)."""
        return set()

    @abc.abstractmethod
    def count_tokens(self, text: str) -> int:
        """Prompt tokens this engine will count for `text`, special tokens included.
        Thread-safe; needs no running engine."""

    @abc.abstractmethod
    def engine_config_hash(self) -> str:
        """Short, stable digest of the model and every setting that changes its output;
        the platform pins it as `model_revision`."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the engine and every process it started. Idempotent."""
