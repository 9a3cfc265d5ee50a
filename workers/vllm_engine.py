"""`VllmEngine`: the `InferenceEngine` port on vLLM V1's AsyncLLM (vLLM 0.32).

What 0.32 expects, and why this adapter does what it does:
- Prompts are rendered first with `renderer.render_cmpl_async` (raw prompts are
  deprecated); the tenant goes in as `cache_salt` on the prompt dict, which salts the
  first prefix-cache block hash so KV blocks never match across tenants.
- `priority` is a `generate()` argument and needs `scheduling_policy="priority"`.
- The CPU KV cache is sized by `kv_cache_memory_bytes`; the legacy `VLLM_CPU_KVCACHE_SPACE`
  (whole GiB) overrides it when set in the environment.
- vLLM's engine processes keep a CPU core busy between steps. They run at a lower CPU
  priority (`cpu_nice`, every thread of them) than the platform's own threads, so on a
  host they share, taking, streaming and admitting work is never queued behind model
  compute; the engine still gets every cycle nobody else wants.
- vLLM binds its compute threads to CPUs of its choosing (`VLLM_CPU_OMP_THREADS_BIND`),
  leaving some for other processes; `compute_cpus()` says which it took, so the worker can
  keep its own threads off them. `pin_to_compute_cpus()` moves the rest of the engine's
  processes (its scheduler) onto those CPUs too, for a worker that asks for it.
- `AsyncLLM.shutdown(timeout)` SIGTERMs the EngineCore process, which stops its worker;
  anything still alive after that is killed here, so no process outlives `close()`.
- A process that dies without `close()` (SIGKILL runs no handler) would leave those
  processes orphaned, so a reaper (`workers.reaper`) started before them ends them then.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from models.engine_settings import detect_device
from workers.engine import (
    EngineDelta,
    EngineError,
    EngineRequest,
    InferenceEngine,
    InvalidEngineRequest,
    KvFigures,
    TokenLogprob,
)
from workers.engine_config import GiB, VllmEngineConfig, engine_config_hash, engine_version  # noqa: F401 (their old home)
from workers.engine_stats import EngineStats, vllm_blocks
from workers.reaper import Reaper

if TYPE_CHECKING:
    from models.settings import Settings

def _thread_ids(processes: list[psutil.Process]) -> Iterator[int]:
    """The ids of the threads of `processes` that are still there (Linux sets CPU priority
    and placement per thread, and threads started later inherit their creator's)."""
    for process in processes:
        try:
            threads = process.threads()
        except psutil.NoSuchProcess:
            continue
        for thread in threads:
            yield thread.id


def lower_cpu_priority(processes: list[psutil.Process], nice: int) -> None:
    """Adds `nice` to every thread of `processes`. Raising it needs no privilege."""
    if nice <= 0:
        return
    for tid in _thread_ids(processes):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        except (ProcessLookupError, PermissionError):
            pass  # gone already, or not ours to change: it keeps its priority


def bound_cpus(processes: list[psutil.Process], allowed: set[int]) -> set[int]:
    """The CPUs that threads of `processes` are bound to, where a thread may use fewer than
    `allowed` (the threads free to go anywhere say nothing)."""
    bound: set[int] = set()
    for tid in _thread_ids(processes):
        try:
            cpus = os.sched_getaffinity(tid)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        if cpus < allowed:
            bound |= cpus
    return bound


def confine_threads(processes: list[psutil.Process], cpus: set[int]) -> int:
    """Moves every thread of `processes` that may run outside `cpus` onto `cpus`; threads
    bound within them already keep their own binding. Returns how many threads moved."""
    moved = 0
    for tid in _thread_ids(processes):
        try:
            if not os.sched_getaffinity(tid) <= cpus:
                os.sched_setaffinity(tid, cpus)
                moved += 1
        except ProcessLookupError:  # the thread ended meanwhile
            pass
    return moved


class VllmEngine(InferenceEngine):
    def __init__(self, config: VllmEngineConfig) -> None:
        self.config = config
        self._llm: Any = None
        self._processes: list[psutil.Process] = []
        self._tokenizer: Any = None
        self._tokenizer_lock = threading.Lock()
        self._revision: str | None = None
        self._compute_cpus: set[int] = set()
        self._reaper: Reaper | None = None
        self.start_seconds: float | None = None
        self.stats = EngineStats() if config.log_stats else None

    @classmethod
    def from_settings(cls, settings: Settings) -> VllmEngine:
        """The engine `settings` describe: its model (a tiny one when none is set), and the
        revision's engine settings where it has them (`settings.engine_settings`)."""
        model = settings.model
        if model is None:
            from workers.tiny_model import make_tiny_model

            model = make_tiny_model(settings.home / "models" / "tiny")
        chosen = settings.engine_settings.model_dump() if settings.engine_settings else {}
        if chosen.get("kv_cache_gb", 0) is None and detect_device().kind == "cpu":  # not given: the worker's
            chosen["kv_cache_gb"] = settings.kv_cache_gb
        return cls(VllmEngineConfig(
            model=Path(model), max_model_len=settings.max_model_len, max_num_seqs=settings.engine_max_seqs,
            cpu_nice=settings.engine_nice, log_stats=settings.engine_stats,
            **{"kv_cache_gb": settings.kv_cache_gb, **chosen}))

    async def start(self) -> None:
        """Start the engine (about 25 s on CPU). Must run on the loop that will drive it."""
        if self._llm is not None:
            return
        from pipelines.log_level import engine_logging

        engine_logging()  # vLLM's loggers, here and in its engine core, at LEDGERLM_LOG_LEVEL
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        # Before the engine's processes, so a death during the start leaves none either.
        if self._reaper is None:
            self._reaper = Reaper.start()
        me = psutil.Process()
        before = {p.pid for p in me.children(recursive=True)}
        began = time.monotonic()
        try:
            self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**self.config.engine_args()),
                                                  stat_loggers=[self.stats.factory] if self.stats else None)
        finally:
            # The resource tracker is shared by the whole process, so it is not ours to end.
            self._processes = [
                p
                for p in me.children(recursive=True)
                if p.pid not in before and "resource_tracker" not in _cmdline(p)
            ]
        lower_cpu_priority(self._processes, self.config.cpu_nice)
        if hasattr(os, "sched_getaffinity"):  # Linux only; elsewhere nothing is bound
            self._compute_cpus = bound_cpus(self._processes, os.sched_getaffinity(0))
        self.start_seconds = time.monotonic() - began

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineDelta]:
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

        llm = self._running()
        if not request.tenant_id:
            raise InvalidEngineRequest("tenant_id is required: it salts the prefix cache")
        try:
            structured = (StructuredOutputsParams(json=request.json_schema) if request.json_schema is not None
                          else StructuredOutputsParams(json_object=True) if request.json_object else None)
            params = SamplingParams(
                max_tokens=request.max_output_tokens, temperature=request.temperature, top_p=request.top_p,
                seed=request.seed, stop=list(request.stop) or None, ignore_eos=request.ignore_eos,
                structured_outputs=structured, logprobs=self._logprobs_of(request),
                output_kind=RequestOutputKind.DELTA,
            )
            (engine_input,) = await llm.renderer.render_cmpl_async(
                [{"prompt": request.prompt, "cache_salt": request.tenant_id}]
            )
        except (ValueError, VLLMClientError) as exc:
            raise InvalidEngineRequest(str(exc)) from exc
        prompt_tokens = len(engine_input["prompt_token_ids"])
        output_tokens = 0
        try:
            async for output in llm.generate(
                engine_input, params, request.request_id, priority=request.priority
            ):
                completion = output.outputs[0]
                new_tokens = len(completion.token_ids)
                output_tokens += new_tokens
                reason = completion.finish_reason
                if reason not in (None, "stop", "length", "abort"):
                    raise EngineError(f"request {request.request_id} ended with {reason}")
                yield EngineDelta(
                    request_id=request.request_id,
                    text=completion.text,
                    new_tokens=new_tokens,
                    output_tokens=output_tokens,
                    finished=output.finished,
                    finish_reason=reason if output.finished else None,
                    prompt_tokens=prompt_tokens,
                    cached_prompt_tokens=output.num_cached_tokens,
                    logprobs=None if request.logprobs is None else token_logprobs(completion, request.logprobs),
                )
        except (ValueError, VLLMClientError) as exc:
            raise InvalidEngineRequest(str(exc)) from exc
        except EngineError:
            raise
        except Exception as exc:  # EngineDeadError, EngineGenerateError, ...
            raise EngineError(f"{type(exc).__name__}: {exc}") from exc

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    async def health(self) -> bool:
        if self._llm is None:
            return False
        try:
            await self._llm.check_health()
        except Exception:
            return False
        return not self._llm.errored

    def errored(self) -> bool:
        # AsyncLLM's monitor thread marks the engine dead as soon as its EngineCore process
        # exits; reading the flag is safe from any thread.
        llm = self._llm
        return llm is not None and bool(llm.errored)

    def count_tokens(self, text: str) -> int:
        # Our own tokenizer instance: the engine's is used on its loop, and a Rust-backed
        # tokenizer raises "Already borrowed" when two threads encode at once.
        with self._tokenizer_lock:
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self.config.model)
            return len(self._tokenizer(text, add_special_tokens=True).input_ids)

    def compute_cpus(self) -> set[int]:
        """The CPUs the engine's processes bound threads to (empty: none bound, or not started)."""
        return set(self._compute_cpus)

    def pin_to_compute_cpus(self) -> set[int]:
        """Keeps all of the engine's processes on the CPUs its compute threads are bound to.

        vLLM binds only its compute threads; its scheduler (the EngineCore process) may run
        anywhere, and at the engine's lower priority it waits behind the platform's threads
        wherever they run. Returns the CPUs it now runs on (empty: nothing bound, so nothing
        moved)."""
        cpus = self.compute_cpus()
        if cpus:
            confine_threads(self._processes, cpus)
        return cpus

    def kv_figures(self) -> KvFigures:
        """The KV cache as vLLM allocated it, known once the engine started, and its use as
        of the last step the stats saw (`workers.engine_stats`); with stats off
        (`log_stats`), only its size."""
        llm = self._llm
        if llm is None:
            return KvFigures()
        cache = llm.vllm_config.cache_config
        blocks, block_size = cache.num_gpu_blocks or 0, cache.block_size
        if self.stats is None:
            return KvFigures(capacity_tokens=blocks * block_size, **vllm_blocks(blocks, block_size))
        return self.stats.kv_figures(blocks, block_size, busy=llm.get_num_unfinished_requests() > 0)

    def max_model_len(self) -> int:
        """vLLM's own figure once started (it may lower the configured one to fit the cache)."""
        llm = self._llm
        return llm.model_config.max_model_len if llm is not None else self.config.max_model_len

    def max_logprobs(self) -> int:
        """vLLM's `max_logprobs` (left at its default by ledgerlm's engine settings)."""
        llm = self._llm
        return llm.model_config.max_logprobs if llm is not None else 20

    def _logprobs_of(self, request: EngineRequest) -> int | None:
        if request.logprobs is not None and request.logprobs > self.max_logprobs():
            raise InvalidEngineRequest(f"logprobs: at most {self.max_logprobs()} alternatives")
        return request.logprobs

    def max_num_seqs(self) -> int:
        """The sequences vLLM schedules at once, as configured."""
        return self.config.max_num_seqs

    def unfinished_requests(self) -> int:
        """Requests the engine still holds: queued, running, or not yet drained."""
        return 0 if self._llm is None else self._llm.get_num_unfinished_requests()

    def engine_config_hash(self) -> str:
        if self._revision is None:
            self._revision = engine_config_hash(self.config)
        return self._revision

    def close(self) -> None:
        llm, self._llm = self._llm, None
        try:
            if llm is not None:
                llm.shutdown(timeout=self.config.shutdown_timeout_s)
        finally:
            processes, self._processes = self._processes, []
            reaper, self._reaper = self._reaper, None
            try:
                _, alive = psutil.wait_procs(processes, timeout=self.config.shutdown_timeout_s)
                for process in alive:
                    process.kill()
                psutil.wait_procs(alive, timeout=5)
            finally:
                if reaper is not None:  # the engine's processes are gone: nothing left to reap
                    reaper.release()

    def _running(self) -> Any:
        if self._llm is None:
            raise EngineError("engine is not running")
        if self._llm.errored:
            raise EngineError("engine is dead")
        return self._llm


def token_logprobs(completion: Any, k: int) -> tuple[TokenLogprob, ...]:
    """The new tokens' log probabilities of one delta, with `k` alternatives each. The
    tokens' texts are cut from the delta's text (what the client was sent), so they join up
    to the answer even where vLLM merged several steps into one delta. A log probability too
    small for a float is -9999, as vLLM's own server writes it (JSON has no -inf)."""
    ids, found = completion.token_ids, list(completion.logprobs or ())
    texts = split_text(completion.text, [at[token_id].decoded_token or "" for token_id, at in zip(ids, found)])
    out = []
    for token_id, at, token in zip(ids, found, texts):
        top = sorted((lp for lp in at.values() if lp.rank is not None and lp.rank <= k), key=lambda lp: lp.rank)[:k]
        out.append(TokenLogprob(token, max(at[token_id].logprob, -9999.0),
                                tuple((lp.decoded_token or "", max(lp.logprob, -9999.0)) for lp in top)))
    return tuple(out)


def split_text(text: str, decoded: list[str]) -> list[str]:
    """`text` cut into one piece per token, after the tokens' texts decoded one by one
    (which may lack the space a tokenizer marks, or hold bytes of a character not yet
    whole): each piece is its decoded text where the text goes on with it (or with a space
    and it), and the last piece is whatever is left, so the pieces always join to `text`."""
    pieces, at = [], 0
    for token in decoded[:-1]:
        for piece in (token, " " + token):
            if token and text.startswith(piece, at):
                break
        else:
            piece = ""
        pieces.append(piece)
        at += len(piece)
    return pieces + [text[at:]] if decoded else []


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""
