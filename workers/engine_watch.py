"""Whether a worker's engine can still run work (`EngineWatch`), and streams that end the
moment it cannot (`WatchedEngine`).

Two signs of death, either enough. vLLM's own dead state (`errored()`: AsyncLLM's
`errored`, which its monitor sets as soon as the EngineCore process dies) is read every
`TICK_S` from the watch's thread, touching nothing of the engine's loop. A health call on
the engine's loop every `interval_s` catches the rest; it is bounded by `timeout_s`, and
`misses` calls unanswered in a row also mean dead (a wedged loop runs nothing, so one slow
answer on a busy host must not end a worker). Once dead, always dead: a worker then takes
nothing more, its running generations fail (`engine_dead`), it leaves the fleet and its
process exits with `EXIT_ENGINE_DEAD`, for a supervisor to restart it on a fresh engine.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Callable

from workers.engine import EngineDead, EngineDelta, EngineRequest, InferenceEngine, KvFigures
from workers.engine_stats import EngineStats
from workers.engine_runner import EngineRunner

logger = logging.getLogger(__name__)

EXIT_ENGINE_DEAD = 75  # sysexits' EX_TEMPFAIL: the process failed, and a restart may well serve


def engine_errored(engine: InferenceEngine) -> bool:
    """The engine's own word that it is dead (the port's `errored`: False from an engine
    that has none to give)."""
    try:
        return bool(engine.errored())
    except Exception:  # reading its state failed: the health call decides
        return False


class EngineWatch:
    TICK_S = 0.1  # how often vLLM's own dead state is read between health calls

    def __init__(self, runner: EngineRunner, engine: InferenceEngine, *, interval_s: float = 1.0,
                 timeout_s: float = 5.0, misses: int = 3):
        self._runner, self._engine = runner, engine
        self.interval_s, self.timeout_s, self.misses = interval_s, timeout_s, max(1, misses)
        self.reason: str | None = None
        self._dead = threading.Event()
        self._lock = threading.Lock()
        self._missed = 0
        self._on_dead: list[Callable[[str], None]] = []
        self._told = False  # the callbacks ran
        self._stop = threading.Event()
        self._wake = threading.Event()  # a death to tell, or the watch stops
        self._thread: threading.Thread | None = None

    @property
    def dead(self) -> bool:
        """Whether the engine is dead; reads vLLM's own state too, so a worker that asks
        before each take never takes work on an engine that died since the last tick."""
        if not self._dead.is_set() and engine_errored(self._engine):
            self._declare("the engine says it is dead")
        return self._dead.is_set()

    def wait_dead(self, timeout_s: float) -> bool:
        return self._dead.wait(timeout_s)

    def on_dead(self, callback: Callable[[str], None]) -> None:
        """`callback(reason)` runs once the engine is found dead, on the watch's thread (or
        on the caller's of `check`, before the watch starts)."""
        self._on_dead.append(callback)

    def check(self) -> bool:
        """One look now: vLLM's own state, then a health call (bounded by `timeout_s`).
        True while the engine lives."""
        if self.dead:
            self._tell_unless_watching()
            return False
        try:
            answer = self._runner.submit_nowait(self._engine.health())
        except RuntimeError:  # the runner was closed: the engine was shut down, not lost
            self._stop.set()
            return True
        try:
            healthy = answer.result(self.timeout_s)
        except TimeoutError:
            answer.cancel()
            self._missed += 1
            if self._missed >= self.misses:
                self._declare(f"{self._missed} health calls in a row unanswered within {self.timeout_s:g}s")
        except Exception as exc:
            self._declare(f"its health call raised {exc!r}")
        else:
            self._missed = 0
            if not healthy:
                self._declare("its health call says unhealthy")
        self._tell_unless_watching()
        return not self.dead

    def start(self, name: str = "engine-watch") -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.timeout_s + 1)

    def _run(self) -> None:
        next_call = time.monotonic() + self.interval_s
        while not self._stop.is_set() and not self.dead:
            if time.monotonic() >= next_call:
                self.check()
                next_call = time.monotonic() + self.interval_s
            self._wake.wait(self.TICK_S)
        if self._dead.is_set():
            self._tell()

    def _declare(self, reason: str) -> None:
        """Marks the engine dead, from any thread (the engine's loop too): at once, and
        without blocking. The callbacks run on the watch's thread (`_tell`)."""
        with self._lock:
            if self._dead.is_set():
                return
            self.reason = reason
            self._dead.set()
        logger.error("engine dead: %s", reason)
        self._wake.set()

    def _tell_unless_watching(self) -> None:
        if self._dead.is_set() and self._thread is None:
            self._tell()

    def _tell(self) -> None:
        with self._lock:
            if self._told:
                return
            self._told = True
        for callback in self._on_dead:
            try:
                callback(self.reason or "")
            except Exception:
                logger.exception("reacting to the engine's death failed")


class WatchedEngine(InferenceEngine):
    """`engine`, whose streams raise `EngineDead` once `watch` finds it dead: those waiting
    on the engine at that moment at once (`end_all`, which the watch calls), the others at
    their next delta. A dead engine may never answer again, so a generation must not wait
    on it for its end. Everything else is the engine's own."""

    def __init__(self, engine: InferenceEngine, watch: EngineWatch, runner: EngineRunner):
        self.inner, self._watch, self._runner = engine, watch, runner
        self._waiting: dict[asyncio.Task, str] = {}  # tasks awaiting the engine's next delta
        self._ending: set[asyncio.Task] = set()  # those `_end_all` cancelled
        watch.on_dead(lambda _reason: self.end_all())

    def end_all(self) -> None:
        """Ends every stream now waiting on the engine (from any thread)."""
        try:
            self._runner.submit_nowait(self._end_all())
        except RuntimeError:  # the runner is closed: no stream is left to end
            pass

    async def _end_all(self) -> None:
        for task in list(self._waiting):
            self._ending.add(task)
            task.cancel()

    def _dead(self, cause: BaseException | None = None) -> EngineDead:
        return EngineDead(self._watch.reason or f"the engine died ({cause!r})")

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineDelta]:
        task = asyncio.current_task()
        stream = self.inner.generate(request)
        try:
            while True:
                if self._watch.dead:
                    raise self._dead()
                self._waiting[task] = request.request_id
                try:
                    delta = await anext(stream)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    if task not in self._ending:
                        raise
                    self._ending.discard(task)
                    task.uncancel()  # the cancel was ours, and it is answered by EngineDead
                    raise self._dead() from None
                except EngineDead:
                    raise
                except Exception as exc:
                    # vLLM fails every request of a dead engine before the watch's next tick;
                    # asking it marks the engine dead at once, before this slot frees.
                    if self._watch.dead:
                        raise self._dead(exc) from exc
                    raise
                finally:
                    self._waiting.pop(task, None)
                yield delta
        finally:
            await stream.aclose()

    async def start(self) -> None:
        await self.inner.start()

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    async def health(self) -> bool:
        return await self.inner.health()

    def errored(self) -> bool:
        return engine_errored(self.inner)

    def kv_figures(self) -> KvFigures:
        return self.inner.kv_figures()

    def max_model_len(self) -> int | None:
        return self.inner.max_model_len()

    def max_num_seqs(self) -> int:
        return self.inner.max_num_seqs()

    def max_logprobs(self) -> int | None:
        return self.inner.max_logprobs()

    @property
    def stats(self) -> EngineStats | None:
        return self.inner.stats

    def compute_cpus(self) -> set[int]:
        return self.inner.compute_cpus()

    def pin_to_compute_cpus(self) -> set[int]:
        return self.inner.pin_to_compute_cpus()

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def engine_config_hash(self) -> str:
        return self.inner.engine_config_hash()

    def close(self) -> None:
        self.inner.close()
