"""Sends a workload's requests to an OpenAI-compatible endpoint and times each one, on
one asyncio loop with httpx. A rejection (429 or 503, whose body names the reason in
`error.code`) is kept apart from a failure, and each request is attributed to its tenant.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import httpx

from api.loadtest.workload import Request, Workload

REJECTED_STATUSES = (429, 503)  # the platform's admission answers: load, budget, capacity


@dataclass
class Timed:
    """What one request did, as the client saw it."""

    tenant: str
    outcome: str = "ok"  # ok | rejected | failed
    reason: str | None = None  # error.code of a rejection or failure
    lag_ms: float = 0.0  # how late it was sent against its schedule (the client's own delay)
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    repeat: bool = False
    revision: str | None = None  # `system_fingerprint`: on the platform, the model revision that ran it
    done_at: float = 0.0  # perf_counter() at its end


def endpoint(target: str, api: str) -> str:
    base = target.rstrip("/")
    base = base[:-3] if base.endswith("/v1") else base
    return f"{base}/v1/{'chat/completions' if api == 'chat' else 'completions'}"


def body(workload: Workload, req: Request) -> dict:
    out = {"model": workload.model, "max_tokens": req.max_tokens, "stream": workload.stream, **workload.extra_body}
    if workload.api == "chat":
        out["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        out["prompt"] = req.prompt
    if workload.stream:
        out["stream_options"] = {"include_usage": True}
    return out


def _error_code(raw: bytes) -> str | None:
    try:
        error = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None


def _content(chunk: dict, api: str) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    return (choices[0].get("delta") or {}).get("content") or "" if api == "chat" else choices[0].get("text") or ""


def _finish(t: Timed, sent: float, ended: float, arrivals: list[float], usage: dict | None) -> Timed:
    t.done_at = ended
    t.e2e_ms = (ended - sent) * 1000
    t.output_tokens = int(usage["completion_tokens"]) if usage else len(arrivals)
    t.prompt_tokens = int(usage.get("prompt_tokens") or t.prompt_tokens) if usage else t.prompt_tokens
    if arrivals:
        t.ttft_ms = (arrivals[0] - sent) * 1000
        if t.output_tokens > 1:
            t.tpot_ms = (ended - arrivals[0]) * 1000 / (t.output_tokens - 1)
        # A chunk may carry several tokens (the platform batches them): each gap between
        # chunks counts as one sample of the gap per token it carried on average.
        if len(arrivals) > 1:
            per_gap = max(1.0, (t.output_tokens - 1) / (len(arrivals) - 1))
            t.itl_ms = [(b - a) * 1000 / per_gap for a, b in zip(arrivals, arrivals[1:])]
    else:  # not streamed: the first token is seen with the last
        t.ttft_ms = t.e2e_ms
    return t


async def send(client: httpx.AsyncClient, url: str, workload: Workload, req: Request, lag_s: float) -> Timed:
    t = Timed(tenant=req.tenant.name, lag_ms=lag_s * 1000, prompt_tokens=req.prompt_tokens, repeat=req.repeat)
    headers = {"Authorization": f"Bearer {req.tenant.api_key}"} if req.tenant.api_key else {}
    sent = time.perf_counter()
    arrivals: list[float] = []
    usage = None
    try:
        async with client.stream("POST", url, json=body(workload, req), headers=headers) as response:
            if response.status_code != 200:
                code = _error_code(await response.aread())
                t.outcome = "rejected" if response.status_code in REJECTED_STATUSES else "failed"
                t.reason = code or f"http_{response.status_code}"
                t.done_at = time.perf_counter()
                return t
            if not workload.stream:
                data = json.loads(await response.aread())
                t.revision = data.get("system_fingerprint")
                return _finish(t, sent, time.perf_counter(), [], data.get("usage"))
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:  # failed after it started: the stream says why
                    t.outcome, t.reason = "failed", (chunk["error"] or {}).get("code") or "stream_error"
                    t.done_at = time.perf_counter()
                    return t
                if _content(chunk, workload.api):
                    arrivals.append(time.perf_counter())
                t.revision = chunk.get("system_fingerprint") or t.revision
                usage = chunk.get("usage") or usage
            return _finish(t, sent, time.perf_counter(), arrivals, usage)
    except (httpx.HTTPError, httpx.StreamError, ValueError, KeyError, TypeError) as exc:
        t.outcome, t.reason, t.done_at = "failed", type(exc).__name__, time.perf_counter()
        return t


@dataclass
class StepRun:
    """One step's requests and what the client spent on them."""

    timed: list[Timed]
    sent: int
    duration_s: float  # first send to last answer
    send_window_s: float  # the span the schedule covered
    client_cpu_s: float


def _client(workload: Workload, timeout_s: float) -> httpx.AsyncClient:
    # No connection cap: an open-loop test must not queue in its own pool.
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0),
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))


async def run_rate(workload: Workload, target: str, rate: float, duration_s: float, rng: random.Random,
                   requests, *, timeout_s: float = 300.0, progress=None) -> StepRun:
    """Open loop: requests sent at the arrival process's offsets whatever the answers."""
    offsets = workload.arrivals.offsets(rate, duration_s, rng)
    if progress is not None:
        progress.reset(total=len(offsets))
    url = endpoint(target, workload.api)
    cpu0 = time.process_time()
    async with _client(workload, timeout_s) as client:
        tasks = []
        start = time.perf_counter()
        for offset in offsets:
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(send(client, url, workload, next(requests),
                                            max(0.0, time.perf_counter() - start - offset)))
            if progress is not None:
                task.add_done_callback(lambda _: progress.update(1))
            tasks.append(task)
        timed = list(await asyncio.gather(*tasks))
        end = max([t.done_at for t in timed], default=time.perf_counter())
    return StepRun(timed, len(offsets), end - start, duration_s, time.process_time() - cpu0)


async def run_concurrency(workload: Workload, target: str, concurrency: int, duration_s: float, requests,
                          *, timeout_s: float = 300.0, progress=None) -> StepRun:
    """Closed loop: `concurrency` senders, each sending its next request when the last ends,
    until `duration_s` has passed."""
    if progress is not None:
        progress.reset(total=float("inf"))  # no known total: a closed loop
    url = endpoint(target, workload.api)
    timed: list[Timed] = []
    cpu0 = time.process_time()
    async with _client(workload, timeout_s) as client:
        start = time.perf_counter()
        until = start + duration_s

        async def sender() -> None:
            while time.perf_counter() < until:
                timed.append(await send(client, url, workload, next(requests), 0.0))
                if progress is not None:
                    progress.update(1)

        await asyncio.gather(*(sender() for _ in range(concurrency)))
        end = max([t.done_at for t in timed], default=time.perf_counter())
    return StepRun(timed, len(timed), end - start, duration_s, time.process_time() - cpu0)
