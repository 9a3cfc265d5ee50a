"""One generation on the engine, from a started work item to its terminal event.

Runs on the engine's loop. Its token and terminal events go through the worker's
`StreamWriter`, which batches them, so a slow log never slows the engine. The request
is aborted at its deadline and ends as cancelled ('deadline').
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future
from contextlib import aclosing
from datetime import datetime, timezone

from models.digests import TenantDigests
from models.events import Envelope, caused_by, decode
from models.events_generation import (
    GenerationCancelled, GenerationCompleted, GenerationFailed, PromptSubmitted, Timings,
)
from pipelines.eventlog import EventLog
from pipelines.outage import Backoff, is_transient
from workers.engine import EngineDead, EngineDelta, EngineRequest, InferenceEngine, InvalidEngineRequest
from workers.stream_writer import StreamWriter

logger = logging.getLogger(__name__)
PRIORITY = {"high": 0, "normal": 1, "batch": 2}  # vLLM runs lower values sooner
# How long a generation's terminal event is tried again while the log is away; past it,
# admission expires the reservation (the generation's deadline plus grace) instead.
END_RETRY_S = 120.0


def fetch_prompt(log: EventLog, ref, wait_s: float = 10.0) -> str:
    # The prompt was appended before its request: a read with a wait of its own fetches it
    # at once, without asking first whether it is there (`EventLog.read`).
    records = log.read(ref.topic, ref.partition, ref.offset, max_records=1, timeout_s=wait_s)
    if not records or records[0].offset != ref.offset:
        raise LookupError(f"prompt at {ref.topic}/{ref.partition}@{ref.offset} is gone")
    payload = decode(records[0].value).payload
    if not isinstance(payload, PromptSubmitted):
        raise LookupError("prompt reference points at something else")
    return payload.prompt


async def serve_generation(engine: InferenceEngine, cancels, queued_env: Envelope, started_env: Envelope,
                           writer: StreamWriter, prompt: Future, taken: Future, *,
                           priority: int | None = None, digests: TenantDigests | None = None) -> int:
    """Returns 1 once a terminal event is written. `prompt` is the prompt's fetch, already
    under way (`fetch_prompt`); `writer` writes the token and terminal events. `priority`
    overrides the one the request's class gives vLLM (lower runs sooner). `digests` keys the
    output's digest (`TenantDigests.from_settings`; the defaults' otherwise).

    `taken` is the commit of the take (`GenerationStarted`), possibly still under way:
    the engine starts at once, but nothing is written until it resolves True. When it
    resolves False the take did not happen: the generation is abandoned (the caller aborts
    it) and returns 0 having written nothing. Once taken, the stream copy of `started_env`
    is written first (the take's own outputs leave the stream topic out)."""
    take = _Take(taken, writer, started_env)
    return await _Generation(engine, cancels, queued_env, started_env, take, writer, prompt, priority,
                             digests or TenantDigests.development()).serve()


class _Take:
    """The commit of a generation's take, seen from the engine's loop: whether the
    generation may write, and the stream copy of its start (`announce`), written once.

    The start is announced as soon as the take commits, unless a delta came while it was
    committing: that delta is held, and goes out in the same append as the start."""

    def __init__(self, taken: Future, writer: StreamWriter, started_env: Envelope):
        self._writer, self._started = writer, started_env
        self.committed = False
        self._holding = False  # a delta waits for the commit
        self._announced = False
        self._outcome = asyncio.ensure_future(self._resolve(taken))

    async def _resolve(self, taken: Future) -> bool:
        if not await asyncio.wrap_future(taken):
            return False
        if not self._holding:  # one holding a delta announces with it, in the same append
            self._announce()  # before anything else of the generation can be queued
        return True

    def _announce(self) -> None:
        self._writer.announce(self._started)
        self._announced = True

    async def may_write(self, *, holding: bool = False) -> bool:
        """Waits for the take's commit; True once it is through. `holding`: the caller has
        a delta to write right after, which then shares the start's append."""
        if not self.committed:
            self._holding = self._holding or holding
            self.committed = await self._outcome
            if self.committed and not self._announced:
                self._announce()
        return self.committed


class _Generation:
    """One request on the engine: `serve` arms the deadline, runs the engine
    (`_run_engine`), then writes the terminal event the run calls for (`_ending`), or a
    failure when anything raised."""

    def __init__(self, engine: InferenceEngine, cancels, queued_env: Envelope, started_env: Envelope,
                 take: _Take, writer: StreamWriter, prompt: Future, priority: int | None, digests: TenantDigests):
        self._engine, self._cancels, self._writer, self._prompt = engine, cancels, writer, prompt
        self._queued, self._started, self._take = queued_env, started_env, take
        self._req = queued_env.payload.request
        self._priority = PRIORITY.get(self._req.priority, 1) if priority is None else priority
        self._t0 = time.monotonic()
        self._first_token_ms: int | None = None
        self._output_tokens = 0
        self._digest = digests.hasher(queued_env.tenant_id)  # keyed per tenant: see models.digests
        self._ran = False  # the engine was given the request
        self._finish_reason: str | None = None

    async def serve(self) -> int:
        timer: asyncio.TimerHandle | None = None
        terminal = None
        try:
            timer = self._arm_deadline()
            # Either way its take failed: nothing of it is written.
            if not await self._run_engine() or not await self._take.may_write():
                return 0
            terminal = self._ending()
        except Exception as exc:  # the request fails; the worker goes on
            terminal = self._failure(exc)
        finally:
            if timer is not None:
                timer.cancel()
            if terminal is not None and await self._take.may_write():
                await self._write_end(terminal)
        return 1 if self._take.committed else 0

    def _failure(self, exc: Exception) -> GenerationFailed:
        """The end of a run that raised: the log's failure (a stream append that could not be
        made) is named as such, with what reached the stream; anything else is the engine's."""
        rid = self._req.request_id
        written = self._writer.written(rid)
        if is_transient(exc):
            logger.warning("generation %s failed: the event log is unavailable (%r)", rid, exc)
            code, message = "log_unavailable", f"The event log was unavailable: {type(exc).__name__}"
        else:
            logger.exception("generation %s failed", rid)
            code, message = ("engine_dead" if isinstance(exc, EngineDead) else "engine_error"), type(exc).__name__
        return GenerationFailed(request_id=rid, error_code=code, message=message,
                                input_tokens=self._req.input_tokens, output_tokens=self._output_tokens,
                                timings=self._timings(),
                                delivered_output_tokens=written if written < self._output_tokens else None)

    async def _write_end(self, terminal) -> None:
        """Writes the terminal event, trying again while the log is away (up to `END_RETRY_S`):
        a generation that failed because its stream could not be written still ends, and
        is settled, once the log is back."""
        backoff, give_up = Backoff(), time.monotonic() + END_RETRY_S
        while True:
            try:
                return await self._writer.finish(self._started, caused_by(self._started, terminal))
            except Exception as exc:
                if not is_transient(exc) or time.monotonic() > give_up:
                    raise
                logger.warning("the end of %s is not written yet (%r); trying again", self._req.request_id, exc)
            await asyncio.sleep(backoff.next())

    def _arm_deadline(self) -> asyncio.TimerHandle | None:
        """At its deadline the request is aborted, and ends as cancelled ('deadline')."""
        if self._req.deadline_at is None:
            return None
        left_s = (self._req.deadline_at - datetime.now(timezone.utc)).total_seconds()
        return asyncio.get_running_loop().call_later(max(0.0, left_s), self._cancels.expire, self._req.request_id)

    def _stopped(self) -> str | None:
        """Why the request was stopped (cancelled, or its deadline), if it was."""
        rid = self._req.request_id
        return self._cancels.in_flight.get(rid) or self._cancels.cancelled.get(rid)

    async def _run_engine(self) -> bool:
        """Streams the request's deltas to the writer until it finishes or is stopped.
        False when its take failed while a delta waited for it: leaving the stream then
        aborts the engine's request."""
        # A cancel or the deadline may come before the engine knows the request, where an
        # abort finds nothing to abort: look before starting, and at every delta.
        if self._stopped():
            return True
        text = await asyncio.wrap_future(self._prompt)
        if self._stopped():
            return True
        self._ran = True
        async with aclosing(self._engine.generate(self._engine_request(text))) as deltas:
            async for delta in deltas:  # leaving early closes the stream, which aborts it
                if delta.text or delta.new_tokens:
                    if not await self._take.may_write(holding=True):
                        return False
                    self._emit(delta)
                if delta.finished:
                    self._finish_reason = delta.finish_reason
                elif self._stopped():
                    break
        await self._writer.drain(self._started)
        return True

    def _engine_request(self, prompt: str) -> EngineRequest:
        req, sampling = self._req, self._req.sampling
        structured = sampling.structured_output
        most = self._engine.max_logprobs()
        if sampling.logprobs is not None and (most is None or sampling.logprobs > most):
            raise InvalidEngineRequest(f"logprobs: the engine gives {'none' if most is None else f'at most {most}'}")
        return EngineRequest(
            request_id=req.request_id, prompt=prompt, max_output_tokens=req.max_output_tokens,
            tenant_id=self._queued.tenant_id, priority=self._priority,
            temperature=sampling.temperature, top_p=sampling.top_p, seed=sampling.seed,
            stop=sampling.stop, ignore_eos=sampling.ignore_eos,
            json_schema=structured.json_schema if structured else None,
            json_object=structured is not None and structured.kind == "json_object",
            logprobs=sampling.logprobs,
        )

    def _emit(self, delta: EngineDelta) -> None:
        if self._first_token_ms is None:
            self._first_token_ms = int((time.monotonic() - self._t0) * 1000)
        self._output_tokens += delta.new_tokens
        self._digest.update(delta.text.encode())
        self._writer.tokens(self._started, delta.text, delta.new_tokens, delta.logprobs)

    def _ending(self) -> GenerationCancelled | GenerationCompleted:
        """The terminal event of a run that raised nothing: cancelled when it was stopped
        (an engine abort with no stop seen is the deadline's), completed otherwise."""
        req = self._req
        cancel_reason = self._stopped() or ("deadline" if self._finish_reason == "abort" else None)
        if cancel_reason:
            delivered = (getattr(self._cancels, "delivered", {}).get(req.request_id) if cancel_reason == "client_gone"
                         else None)
            return GenerationCancelled(request_id=req.request_id, reason=cancel_reason,
                                       input_tokens=req.input_tokens if self._ran else 0,
                                       output_tokens=self._output_tokens, timings=self._timings(),
                                       delivered_output_tokens=None if delivered is None
                                       else min(delivered, self._output_tokens))
        return GenerationCompleted(
            request_id=req.request_id, finish_reason=self._finish_reason or "stop",
            input_tokens=req.input_tokens, output_tokens=self._output_tokens,
            model_revision=self._started.payload.model_revision,
            output_sha256=self._digest.hexdigest(), timings=self._timings())

    def _timings(self) -> Timings:
        return Timings(queued_ms=self._started.payload.queued_ms, ttft_ms=self._first_token_ms,
                       duration_ms=int((time.monotonic() - self._t0) * 1000))
