"""Runs an `InferenceEngine` on its own event loop in a background thread.

vLLM's AsyncLLM binds to the loop it is created on (its output handler is a task there and
its ZMQ sockets belong to it), so one long-lived loop owns the engine and every other
thread — a Kafka consumer, a Celery task, a test — hands it coroutines."""
from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from workers.engine import EngineDelta, EngineRequest, InferenceEngine

T = TypeVar("T")
_END = object()


class EngineRunner:
    def __init__(self, engine: InferenceEngine, *, name: str = "engine-loop") -> None:
        self.engine = engine
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name=name, daemon=True)
        self._closed = False

    def start(self, timeout: float | None = 300.0) -> EngineRunner:
        """Start the loop thread and the engine on it; returns self once it is ready."""
        self._thread.start()
        try:
            self.submit(self.engine.start(), timeout=timeout)
        except BaseException:
            self.close()
            raise
        return self

    def submit(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the engine's loop and wait for its result."""
        return self.submit_nowait(coro).result(timeout)

    def submit_nowait(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._closed:
            coro.close()
            raise RuntimeError("EngineRunner is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def stream(
        self, request: EngineRequest, timeout: float | None = None
    ) -> Iterator[EngineDelta]:
        """Iterate a generation from a plain thread. `timeout` bounds the wait for each
        delta. Leaving the loop early (break, exception, close) aborts the request."""
        deltas: queue.Queue[object] = queue.Queue()

        async def pump() -> None:
            try:
                async for delta in self.engine.generate(request):
                    deltas.put(delta)
            except BaseException as exc:  # handed to the consuming thread
                deltas.put(exc)
            finally:
                deltas.put(_END)

        future = self.submit_nowait(pump())
        try:
            while True:
                try:
                    item = deltas.get(timeout=timeout)
                except queue.Empty:
                    message = f"no delta for {request.request_id} in {timeout}s"
                    raise TimeoutError(message) from None
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
        finally:
            # Cancelling the pump closes the engine's stream, which aborts the request.
            future.cancel()

    def close(self, timeout: float = 60.0) -> None:
        """Close the engine on its own loop, then stop the loop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():

            async def shutdown() -> None:
                try:
                    self.engine.close()
                finally:
                    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)

            try:
                asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout)
        else:
            self.engine.close()
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> EngineRunner:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()
