"""The interactive pool worker: takes queued generations, runs them on the engine, and
writes what happened to the log.

Work is taken once: a batch of work items is committed together with their
`GenerationStarted` events, before any token is made. If this process dies mid-stream,
the admission processor expires the reservation at deadline + grace and the request
ends as failed; nothing runs twice. Token deltas that arrive while an append is in
flight are merged into the next `TokensEmitted`, so a slow log never slows the engine.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from datetime import datetime, timezone

from models import topics
from models.events import EventDecodeError, caused_by, decode
from models.events_generation import (
    CancelRequested, GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationQueued,
    GenerationStarted, PromptSubmitted, Timings, TokensEmitted,
)
from pipelines.eventlog import EventLog
from pipelines.routing import publish, to_outputs
from workers.engine import EngineRequest, InferenceEngine
from workers.engine_runner import EngineRunner

logger = logging.getLogger(__name__)
PRIORITY = {"high": 0, "normal": 1, "batch": 2}


def _ms_since(start: datetime, now: datetime | None = None) -> int:
    return max(0, int(((now or datetime.now(timezone.utc)) - start).total_seconds() * 1000))


class CancelWatch:
    """Follows the requests topic from now on and aborts cancelled requests in flight."""

    def __init__(self, log: EventLog, runner: EngineRunner, engine: InferenceEngine):
        self._log, self._runner, self._engine = log, runner, engine
        self.in_flight: dict[str, str] = {}  # request_id -> reason once cancelled, "" before
        self._next = {p: log.end_offset(topics.REQUESTS.name, p) for p in range(log.partitions(topics.REQUESTS.name))}

    def poll(self) -> None:
        for partition, offset in self._next.items():
            for record in self._log.read(topics.REQUESTS.name, partition, offset, max_records=500):
                self._next[partition] = record.offset + 1
                try:
                    env = decode(record.value)
                except EventDecodeError:
                    continue
                if isinstance(env.payload, CancelRequested) and env.payload.request_id in self.in_flight:
                    self.in_flight[env.payload.request_id] = env.payload.reason
                    self._runner.submit_nowait(self._engine.abort(env.payload.request_id))


class InteractiveWorker:
    def __init__(self, log: EventLog, runner: EngineRunner, engine: InferenceEngine, *,
                 pool: str = "interactive", max_in_flight: int = 8, worker_id: str | None = None):
        self._log, self._runner, self._engine = log, runner, engine
        self.worker_id = worker_id or f"{pool}-{os.getpid()}"
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._max_in_flight = max_in_flight
        work_topics = [topics.WORK_HIGH.name, topics.WORK_NORMAL.name]
        self._consumer = log.consumer(f"ledgerlm-pool-{pool}", work_topics, member_id=self.worker_id)
        self._cancels = CancelWatch(log, runner, engine)
        self.served = 0

    def _free_slots(self) -> int:
        return self._slots._value  # noqa: SLF001 - the semaphore's count is exactly what we need

    def run_once(self, timeout_s: float = 0.2) -> int:
        self._cancels.poll()
        free = self._free_slots()
        if free == 0:
            time.sleep(0.005)  # every slot busy: the engine is the bottleneck, not us
            return 0
        records = self._consumer.poll(max_records=free, timeout_s=timeout_s)
        if not records:
            return 0
        items, outputs = [], []
        now = datetime.now(timezone.utc)
        for record in records:
            try:
                env = decode(record.value)
            except EventDecodeError as exc:
                logger.warning("unreadable work item %s/%s@%s: %s", record.topic, record.partition, record.offset, exc)
                continue
            if not isinstance(env.payload, GenerationQueued):
                continue
            req = env.payload.request
            queued_ms = _ms_since(env.payload.queued_at, now)
            if req.deadline_at is not None and req.deadline_at <= now:
                failed = caused_by(env, GenerationFailed(
                    request_id=req.request_id, error_code="deadline_expired", message="deadline passed in the queue",
                    input_tokens=0, timings=Timings(queued_ms=queued_ms)))
                outputs += [(topics.OUTCOMES, failed), (topics.STREAM, failed)]
                continue
            started = caused_by(env, GenerationStarted(
                request_id=req.request_id, worker_id=self.worker_id, model_revision=req.model_revision,
                queued_ms=queued_ms))
            outputs += [(topics.OUTCOMES, started), (topics.STREAM, started)]
            items.append((env, started))
        self._consumer.commit_with(to_outputs(outputs))
        for env, started in items:
            self._slots.acquire()
            self._cancels.in_flight[env.payload.request.request_id] = ""
            self._runner.submit_nowait(self._serve(env, started))
        return len(items)

    async def _serve(self, queued_env, started_env) -> None:
        item: GenerationQueued = queued_env.payload
        req = item.request
        t0 = time.monotonic()
        first_token_ms: int | None = None
        seq = 0
        output_tokens = 0
        digest = hashlib.sha256()
        pending_text, pending_tokens = [], 0
        flusher: asyncio.Task | None = None

        async def flush() -> None:
            nonlocal pending_text, pending_tokens, seq
            while pending_text or pending_tokens:
                text, count = "".join(pending_text), pending_tokens
                pending_text, pending_tokens = [], 0
                env = caused_by(started_env, TokensEmitted(request_id=req.request_id, seq=seq, text=text, token_count=count))
                seq += 1
                await asyncio.to_thread(publish, self._log, topics.STREAM, [env])

        terminal = None
        try:
            prompt = await asyncio.to_thread(self._fetch_prompt, req.prompt_ref)
            engine_request = EngineRequest(
                request_id=req.request_id, prompt=prompt, max_output_tokens=req.max_output_tokens,
                tenant_id=queued_env.tenant_id, priority=PRIORITY.get(req.priority, 1),
                temperature=req.sampling.temperature, top_p=req.sampling.top_p, seed=req.sampling.seed,
                stop=req.sampling.stop, ignore_eos=req.sampling.ignore_eos,
            )
            finish_reason = None
            async for delta in self._engine.generate(engine_request):
                if delta.text or delta.new_tokens:
                    if first_token_ms is None:
                        first_token_ms = int((time.monotonic() - t0) * 1000)
                    pending_text.append(delta.text)
                    pending_tokens += delta.new_tokens
                    output_tokens += delta.new_tokens
                    digest.update(delta.text.encode())
                    if flusher is None or flusher.done():
                        flusher = asyncio.ensure_future(flush())
                if delta.finished:
                    finish_reason = delta.finish_reason
            if flusher is not None:
                await flusher
            await flush()
            timings = Timings(queued_ms=started_env.payload.queued_ms, ttft_ms=first_token_ms,
                              duration_ms=int((time.monotonic() - t0) * 1000))
            cancel_reason = self._cancels.in_flight.get(req.request_id) or (
                "deadline" if finish_reason == "abort" else None)
            if cancel_reason:
                terminal = GenerationCancelled(request_id=req.request_id, reason=cancel_reason,
                                               input_tokens=req.input_tokens, output_tokens=output_tokens,
                                               timings=timings)
            else:
                terminal = GenerationCompleted(
                    request_id=req.request_id, finish_reason=finish_reason or "stop",
                    input_tokens=req.input_tokens, output_tokens=output_tokens, model_revision=req.model_revision,
                    output_sha256=digest.hexdigest(), timings=timings)
        except Exception as exc:  # the request fails; the worker goes on
            logger.exception("generation %s failed", req.request_id)
            if flusher is not None:
                await asyncio.gather(flusher, return_exceptions=True)
            terminal = GenerationFailed(request_id=req.request_id, error_code="engine_error",
                                        message=type(exc).__name__, input_tokens=req.input_tokens,
                                        output_tokens=output_tokens,
                                        timings=Timings(queued_ms=started_env.payload.queued_ms,
                                                        duration_ms=int((time.monotonic() - t0) * 1000)))
        finally:
            try:
                if terminal is not None:
                    env = caused_by(started_env, terminal)
                    await asyncio.to_thread(self._publish_terminal, env)
                    self.served += 1
            finally:
                self._cancels.in_flight.pop(req.request_id, None)
                self._slots.release()

    def _publish_terminal(self, env) -> None:
        # The stream copy first: the client learns the end as soon as possible; the
        # outcomes copy is what settles the reservation.
        publish(self._log, topics.STREAM, [env])
        publish(self._log, topics.OUTCOMES, [env])

    def _fetch_prompt(self, ref) -> str:
        records = self._log.read(ref.topic, ref.partition, ref.offset, max_records=1)
        if not records or records[0].offset != ref.offset:
            raise LookupError(f"prompt at {ref.topic}/{ref.partition}@{ref.offset} is gone")
        payload = decode(records[0].value).payload
        if not isinstance(payload, PromptSubmitted):
            raise LookupError("prompt reference points at something else")
        return payload.prompt

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.run_once()

    def close(self, drain_timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + drain_timeout_s
        while self._free_slots() < self._max_in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        self._consumer.close()
