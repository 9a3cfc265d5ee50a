"""Running an interactive worker's taken work on its engine (`workers.interactive`).

A generation starts on the engine runner as soon as it is taken, while its take commits
(on Kafka, a transaction of a few round trips), its prompt read meanwhile; it writes
nothing until the take is through (`taken`), and a failed take aborts it unwritten
(`abandon`, which waits, bounded, until it is out of the engine, so the same request,
taken again, never meets its abandoned self there). Running work is aborted on
`CancelRequested` (`workers.cancel_watch`) and at its deadline (`workers.generation`).
Token and terminal events go out through one `StreamWriter`, batched across generations,
so a slow log never slows the engine.

Generations run on the watched engine (`workers.engine_watch`): once the engine is found
dead, those waiting on it end at once and fail (`engine_dead`). At close, what a dead
engine left hanging, taken and never ended, fails from here (`fail_stranded`), so its
reservations settle now instead of at deadline + grace.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable

from models import topics
from models.digests import TenantDigests
from models.events import Envelope, caused_by
from models.events_generation import GenerationFailed
from pipelines.eventlog import EventLog
from pipelines.publish import publish
from workers.cancel_watch import CancelWatch
from workers.engine import InferenceEngine
from workers.engine_runner import EngineRunner
from workers.engine_watch import EngineWatch, WatchedEngine
from workers.generation import fetch_prompt, serve_generation
from workers.stream_writer import StreamWriter

logger = logging.getLogger(__name__)


class WorkRunning:
    """Runs a worker's taken generations on `engine` through `runner`: `capacity` of them at
    once at most (its engine's `running` and its take-ahead)."""

    ABANDON_WAIT_S = 10.0  # the most a failed take waits for its generations to leave the engine
    DEAD_DRAIN_S = 5.0  # the most `drain` waits for generations of a dead engine to end on their own

    def __init__(self, log: EventLog, runner: EngineRunner, engine: InferenceEngine, cancels: CancelWatch, *,
                 worker_id: str, running: int, capacity: int, stream_linger_s: float = 0.0,
                 health_interval_s: float = 1.0, digests: TenantDigests | None = None):
        self._log, self._runner, self._cancels = log, runner, cancels
        self.worker_id = worker_id
        self._digests = digests  # keys output digests per tenant (the settings' digest_key)
        # Generations run on the watched engine: once it is found dead, they end at once.
        self.watch = EngineWatch(runner, engine, interval_s=health_interval_s)
        self._serving_engine = WatchedEngine(engine, self.watch, runner)
        self._watching = False
        self._serving: dict[str, tuple[Envelope, Future]] = {}  # running generations: start, take
        self.io = ThreadPoolExecutor(capacity + 2, thread_name_prefix=f"{worker_id}-io")
        self.writer = StreamWriter(log, self.io, linger_s=stream_linger_s, full_at=running)
        self.served = 0

    @property
    def engine_dead(self) -> bool:
        return self.watch.dead

    def watch_engine(self) -> None:
        """Looks at its engine and starts watching it (once; a dead engine is not watched)."""
        if not self._watching:
            self._watching = True
            if self.watch.check():
                self.watch.start(name=f"{self.worker_id}-engine-watch")

    def launch(self, queued: Envelope, started: Envelope, priority: int, taken: Future,
               done: Callable[[], None]) -> Future:
        """Starts taken work on the engine, its prompt read meanwhile (a read is harmless if
        the take fails); it writes nothing until `taken` resolves True. `done` runs once it
        has left the engine."""
        prompt = self.io.submit(fetch_prompt, self._log, queued.payload.request.prompt_ref)
        self._cancels.in_flight[started.payload.request_id] = ""
        self._serving[started.payload.request_id] = (started, taken)
        return self._runner.submit_nowait(self._serve(queued, started, priority, prompt, taken, done))

    async def _serve(self, queued: Envelope, started_env: Envelope, priority: int, prompt: Future, taken: Future,
                     done: Callable[[], None]) -> None:
        try:
            ended = await serve_generation(self._serving_engine, self._cancels, queued, started_env,
                                           self.writer, prompt, taken, priority=priority, digests=self._digests)
            self.served += ended
        finally:
            self._serving.pop(started_env.payload.request_id, None)
            self._cancels.in_flight.pop(started_env.payload.request_id, None)
            done()

    def abandon(self, started: list[Envelope], serving: list[Future]) -> None:
        """Stops generations whose take failed, and waits (bounded) until they are out of
        the engine, so the same request, taken again, never meets its abandoned self there."""
        for env in started:
            self._cancels.untaken(env.payload.request_id)
        _, left = wait(serving, timeout=self.ABANDON_WAIT_S)
        if left:
            logger.error("%s: %d abandoned generations still in the engine after %ss",
                         self.worker_id, len(left), self.ABANDON_WAIT_S)

    def drain(self, in_flight: Callable[[], int], timeout_s: float) -> None:
        """Waits (at most `timeout_s`) until `in_flight()` is 0: running generations finish.
        A dead engine's generations end at once, or never: for them it waits `DEAD_DRAIN_S`."""
        deadline, cut = time.monotonic() + timeout_s, False
        while in_flight() and time.monotonic() < deadline:
            if self.engine_dead and not cut:
                cut, deadline = True, min(deadline, time.monotonic() + self.DEAD_DRAIN_S)
            time.sleep(0.05)

    def fail_stranded(self) -> None:
        """Ends, from here, the taken generations a dead engine left hanging (its loop no
        longer runs them): failed, with what reached the log of them counted by nobody, so
        their reservations settle now instead of at deadline + grace."""
        for request_id, (started, taken) in list(self._serving.items()):
            if not (taken.done() and taken.result()):
                continue  # never taken: nothing of it is on the log
            terminal = caused_by(started, GenerationFailed(
                request_id=request_id, error_code="engine_dead", message="the engine died mid-generation"))
            try:
                publish(self._log, topics.OUTCOMES, [terminal])
                publish(self._log, topics.STREAM, [terminal])
            except Exception:
                logger.exception("%s: could not end %s; it expires at its deadline", self.worker_id, request_id)
