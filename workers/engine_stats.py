"""`EngineStats`: what vLLM says of its own steps, kept for the worker's metrics.

vLLM (0.32) hands every step's `SchedulerStats` and `IterationStats` to its stat loggers
when stats are on; this is one of them (a per-engine logger: `AsyncLLM(stat_loggers=
[stats.factory])`), duck-typed so nothing here imports vLLM. It keeps numbers only, on the
engine's loop; `workers.metrics` reads them at scrape time. With a logger of ours and
`disable_log_stats`, vLLM runs none of its logging loggers (no log lines per step), but
adds its own Prometheus logger (`vllm:*` series in prometheus_client's global registry,
which a worker's metrics server serves too).

The KV cache's size is not a step's: `VllmEngine.kv_figures` reads it from the engine's
config, and the tokens in use from `kv_cache_usage` here.

Step times need `enable_logging_iteration_details`: the engine core then times each
model step (`SchedulerStats.iteration_details.elapsed_ms`).
"""
from __future__ import annotations

import bisect

from workers.engine import KvFigures

STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def vllm_blocks(blocks: int, block_size: int) -> dict[str, int]:
    """How vLLM hands out a cache of `blocks` blocks: whole blocks of `block_size` tokens,
    one of them its null block, which no request holds."""
    return {"block_tokens": block_size, "reserved_tokens": block_size if blocks else 0}


class EngineStats:
    def __init__(self) -> None:
        self.kv_cache_usage = 0.0  # fraction of the KV cache's blocks in use, 0..1
        self.running = 0
        self.waiting = 0
        self.preemptions = 0
        # Prompt tokens looked up in the prefix cache and found there (vLLM hands each step's
        # share; these are the running totals).
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.generation_tokens = 0
        self.step_counts = [0] * (len(STEP_BUCKETS_S) + 1)  # per bucket, the last one +Inf
        self.step_sum_s = 0.0
        self.steps = 0

    def factory(self, vllm_config=None, engine_index: int = 0) -> "EngineStats":
        """vLLM's per-engine logger factory: every engine of this adapter reports here."""
        return self

    # -- vLLM's StatLoggerBase ----------------------------------------------------------

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        if scheduler_stats is not None:
            self.kv_cache_usage = scheduler_stats.kv_cache_usage
            self.running = scheduler_stats.num_running_reqs
            self.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
            prefix = scheduler_stats.prefix_cache_stats
            if prefix is not None:
                self.prefix_cache_queries += prefix.queries
                self.prefix_cache_hits += prefix.hits
            details = scheduler_stats.iteration_details
            if details is not None and not details.is_dummy:
                self.observe_step(details.elapsed_ms / 1000)
        if iteration_stats is not None:
            self.preemptions += iteration_stats.num_preempted_reqs
            self.generation_tokens += iteration_stats.num_generation_tokens

    def log(self) -> None:
        pass

    def log_engine_initialized(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int = 0, level: int = 0) -> None:
        pass

    def record_admission_rejection(self, reason: str) -> None:
        pass

    # -- ours ---------------------------------------------------------------------------

    def kv_figures(self, blocks: int, block_size: int, *, busy: bool) -> KvFigures:
        """The figures of a KV cache of `blocks` blocks of `block_size` tokens, as vLLM
        allocated it, with its use as the last step said. vLLM keeps one block aside (its
        null block) and states usage over the rest. No step follows an abort that leaves the
        engine idle, so the last usage can outlive the requests it counted: an engine with
        no request (`busy` False) holds no blocks."""
        usage = self.kv_cache_usage if busy else 0.0
        return KvFigures(capacity_tokens=blocks * block_size,
                         used_tokens=round(usage * max(0, blocks - 1)) * block_size, usage=usage,
                         preemptions=self.preemptions, prefix_cache_queries=self.prefix_cache_queries,
                         prefix_cache_hits=self.prefix_cache_hits, **vllm_blocks(blocks, block_size))

    def observe_step(self, seconds: float) -> None:
        self.step_counts[bisect.bisect_left(STEP_BUCKETS_S, seconds)] += 1
        self.step_sum_s += seconds
        self.steps += 1
