"""One generation on the engine, from a started work item to its terminal event.

Runs on the engine's loop. Its token and terminal events go through the worker's
`StreamWriter`, which batches them, so a slow log never slows the engine. The request
is aborted at its deadline and ends as cancelled ('deadline').
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from concurrent.futures import Future
from contextlib import aclosing
from datetime import datetime, timezone

from models.events import Envelope, caused_by, decode
from models.events_generation import (
    GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationQueued, PromptSubmitted, Timings,
)
from pipelines.eventlog import EventLog
from workers.engine import EngineRequest, InferenceEngine
from workers.stream_writer import StreamWriter

logger = logging.getLogger(__name__)
PRIORITY = {"high": 0, "normal": 1, "batch": 2}  # vLLM runs lower values sooner


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
                           priority: int | None = None) -> int:
    """Returns 1 once a terminal event is written. `prompt` is the prompt's fetch, already
    under way (`fetch_prompt`); `writer` writes the token and terminal events. `priority`
    overrides the one the request's class gives vLLM (lower runs sooner).

    `taken` is the commit of the take (`GenerationStarted`), possibly still under way:
    the engine starts at once, but nothing is written until it resolves True. When it
    resolves False the take did not happen: the generation is abandoned (the caller aborts
    it) and returns 0 having written nothing. Once taken, the stream copy of `started_env`
    is written first (the take's own outputs leave the stream topic out)."""
    loop = asyncio.get_running_loop()
    item: GenerationQueued = queued_env.payload
    req = item.request
    t0 = time.monotonic()
    first_token_ms: int | None = None
    output_tokens = 0
    digest = hashlib.sha256()
    timer: asyncio.TimerHandle | None = None

    def timings() -> Timings:
        return Timings(queued_ms=started_env.payload.queued_ms, ttft_ms=first_token_ms,
                       duration_ms=int((time.monotonic() - t0) * 1000))

    terminal = None
    committed = False
    holding = False  # a delta came while the take was still committing
    announced = False

    async def take_then_announce() -> bool:
        nonlocal announced
        if await asyncio.wrap_future(taken):
            if not holding:  # one holding a delta announces with it, in the same append
                writer.announce(started_env)  # before anything else of it can be queued
                announced = True
            return True
        return False

    take = asyncio.ensure_future(take_then_announce())

    async def may_write() -> bool:
        nonlocal committed, announced
        if not committed:
            committed = await take
            if committed and not announced:
                writer.announce(started_env)
                announced = True
        return committed

    try:
        if req.deadline_at is not None:
            left_s = (req.deadline_at - datetime.now(timezone.utc)).total_seconds()
            timer = loop.call_later(max(0.0, left_s), cancels.expire, req.request_id)
        finish_reason, ran = None, False

        def stopped() -> str | None:
            return cancels.in_flight.get(req.request_id) or cancels.cancelled.get(req.request_id)

        # A cancel or the deadline may come before the engine knows the request, where an
        # abort finds nothing to abort: look before starting, and at every delta.
        if not stopped():
            text = await asyncio.wrap_future(prompt)
        if not stopped():
            ran = True
            engine_request = EngineRequest(
                request_id=req.request_id, prompt=text, max_output_tokens=req.max_output_tokens,
                tenant_id=queued_env.tenant_id,
                priority=PRIORITY.get(req.priority, 1) if priority is None else priority,
                temperature=req.sampling.temperature, top_p=req.sampling.top_p, seed=req.sampling.seed,
                stop=req.sampling.stop, ignore_eos=req.sampling.ignore_eos,
            )
            async with aclosing(engine.generate(engine_request)) as deltas:
                async for delta in deltas:  # leaving early closes the stream, which aborts it
                    if delta.text or delta.new_tokens:
                        if not committed:
                            holding = True
                            if not await may_write():
                                return 0  # leaving aborts the engine's request
                        if first_token_ms is None:
                            first_token_ms = int((time.monotonic() - t0) * 1000)
                        output_tokens += delta.new_tokens
                        digest.update(delta.text.encode())
                        writer.tokens(started_env, delta.text, delta.new_tokens)
                    if delta.finished:
                        finish_reason = delta.finish_reason
                    elif stopped():
                        break
            await writer.drain(started_env)
        if not await may_write():  # its take failed: nothing of it is written
            return 0
        cancel_reason = stopped() or ("deadline" if finish_reason == "abort" else None)
        if cancel_reason:
            terminal = GenerationCancelled(request_id=req.request_id, reason=cancel_reason,
                                           input_tokens=req.input_tokens if ran else 0,
                                           output_tokens=output_tokens, timings=timings())
        else:
            terminal = GenerationCompleted(
                request_id=req.request_id, finish_reason=finish_reason or "stop",
                input_tokens=req.input_tokens, output_tokens=output_tokens, model_revision=req.model_revision,
                output_sha256=digest.hexdigest(), timings=timings())
    except Exception as exc:  # the request fails; the worker goes on
        logger.exception("generation %s failed", req.request_id)
        terminal = GenerationFailed(request_id=req.request_id, error_code="engine_error",
                                    message=type(exc).__name__, input_tokens=req.input_tokens,
                                    output_tokens=output_tokens, timings=timings())
    finally:
        if timer is not None:
            timer.cancel()
        if terminal is not None and await may_write():
            await writer.finish(started_env, caused_by(started_env, terminal))
    return 1 if committed else 0
