"""Starting a generation (or finding the one an idempotent retry means) and waiting for
its first stream event, so the caller knows the HTTP status before sending anything:
a rejection by admission becomes a real 429/400/413, never a 200 with an error inside.

Which generation a request means (ids, `Idempotency-Key`, the key race) is decided in
`pipelines.generation.idempotency`; this module turns its answers into streams and HTTP errors.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from fastapi import Request

from api.deps import Services
from api.disconnect import unless_gone
from api import outage
from api.errors import ApiError, ClientGone, rejection_error
from api.request_stream import RequestStream, StreamTimeout
from api.stream_hub import StreamEvent
from models import topics
from models.events import caused_by
from models.events_generation import (
    CacheHit, GenerationCompleted, GenerationRejected, GenerationRequested, Timings, TokensEmitted,
)
from models.registry import Principal
from pipelines.generation import idempotency
from pipelines.eventlog import partition_for
from pipelines.generation.request_index import RequestInfo
from pipelines.publish import publish
from pipelines.generation.submission import SubmissionError, SubmitGeneration, Submitted, submit_generation


@dataclass
class Live:
    """A generation whose first event is known (and was not a rejection)."""

    stream: RequestStream
    first: StreamEvent
    deadline: float  # loop time after which waiting for more is pointless
    replayed: bool
    request: GenerationRequested | None = None  # as submitted (None for a replay)

    @property
    def route_headers(self) -> dict[str, str]:
        """What served it and why, for the response's headers: the revision, the router's
        rule (where a router chose), and the revision it fell back from (where it did)."""
        r = self.request
        if r is None:
            return {}
        out = {"X-Model-Revision": r.model_revision}
        if r.route_rule is not None:
            out["X-Routed-By"] = r.route_rule
        if r.fallback_from is not None:
            out["X-Fallback-From"] = r.fallback_from
        if r.cache is not None:
            out["X-Cache"] = "hit"
        return out

    @property
    def request_id(self) -> str:
        return self.stream.request_id

    async def events(self):
        yield self.first
        loop = asyncio.get_running_loop()
        async for event in self.stream.events(self.deadline - loop.time()):
            yield event


def pool_of(priority: str) -> str:
    return topics.WORK_BY_PRIORITY.get(priority, topics.WORK_NORMAL).name.rsplit(".", 1)[-1]


def _wait_s(svc: Services, deadline_at: datetime | None) -> float:
    """Until the deadline, plus the grace after which admission expires a lost request, plus
    room for that expiry to reach us: the platform's own verdict should win over this net."""
    if deadline_at is None:
        left = svc.settings.default_deadline_ms / 1000
    else:
        left = (deadline_at - datetime.now(timezone.utc)).total_seconds()
    return max(0.0, left) + svc.settings.grace_s + 5.0


def _key_reused() -> ApiError:
    return ApiError(409, "This Idempotency-Key was already used with a different request body",
                    code="idempotency_key_reused", param="Idempotency-Key")


# Refusals for capacity, which the overload ladder may answer with a smaller revision. Never
# a budget, limit, authentication or context-length error: a fallback would not fix those.
FALLBACK_CODES = frozenset({"shed", "no_capacity", "kv_capacity"})


async def start_generation(svc: Services, principal: Principal, cmd: SubmitGeneration, *, request: Request,
                           body: dict, idempotency_key: str | None, id_prefix: str) -> Live:
    """The overload ladder around one start: a router alias's request refused for capacity
    (before anything of it was streamed or charged) is sent again, once per fallback
    revision at most, to the next of the router's smaller revisions that a live worker
    serves; it is admitted, reserved and settled at that revision's price. A revision
    refused so cools down for a while (`api.ladder`): requests routed to it meanwhile go
    to the fallback at once."""
    tried: list[str] = []
    key = idempotency_key
    while True:
        try:
            return await _start_once(svc, principal, cmd, request=request, body=body,
                                     idempotency_key=idempotency_key, id_prefix=id_prefix)
        except (ApiError, SubmissionError) as exc:
            refused = exc.model_revision
            if exc.code not in FALLBACK_CODES or refused is None:
                raise
            svc.ladder.refused(cmd.model_alias, refused)
            tried.append(refused)
            fallback = svc.ladder.fallback(svc.registry_view.registry, cmd.model_alias, tried, svc.fleet,
                                           pool=_pool_of(svc, principal))
            if fallback is None:
                raise
            cmd = replace(cmd, fallback_to=fallback, fallback_from=refused,
                          request_id=None if cmd.request_id is None else f"{cmd.request_id}.fb{len(tried)}")
            # Keyed too (a key derived from the client's), so a retry finds what the fallback served.
            idempotency_key = None if key is None else idempotency.fallback_key(key, len(tried))


def _pool_of(svc: Services, principal: Principal) -> str:
    return svc.registry_view.registry.limits_for(principal.tenant_id).pool or topics.SHARED_POOL


async def _start_once(svc: Services, principal: Principal, cmd: SubmitGeneration, *, request: Request,
                      body: dict, idempotency_key: str | None, id_prefix: str) -> Live:
    t0 = time.monotonic()
    await _tokenizer_loaded(svc, principal, cmd)
    # By then admission must have decided (reading the log for ids included): 503 otherwise.
    decide_by = time.monotonic() + svc.settings.decision_timeout_s
    identified = await _identified(svc, principal.tenant_id, cmd, body=body, idempotency_key=idempotency_key,
                                   id_prefix=id_prefix, decide_by=decide_by)
    if isinstance(identified, idempotency.Replay):
        return await replay_generation(svc, principal.tenant_id, identified.request_id, request=request)
    return await _submitted(svc, principal, identified, request=request, t0=t0, decide_by=decide_by)


async def _identified(svc: Services, tenant_id: str, cmd: SubmitGeneration, *, body: dict,
                      idempotency_key: str | None, id_prefix: str,
                      decide_by: float) -> SubmitGeneration | idempotency.Replay:
    """The request with its id, or the generation an idempotent retry means (a replay)."""
    try:
        return await outage.within(asyncio.ensure_future(asyncio.to_thread(
            idempotency.identify, cmd, tenant_id=tenant_id, body=body, idempotency_key=idempotency_key,
            id_prefix=id_prefix, index=svc.index, now=datetime.now(timezone.utc),
            digests=svc.digests)), decide_by, "The event log", svc.log_watch)
    except idempotency.KeyReused:
        raise _key_reused() from None
    except idempotency.RequestIdInUse as exc:
        raise ApiError(409, f"request_id '{exc.chosen}' is already used by generation {exc.existing}; choose another",
                       code="request_id_in_use", param="request_id") from None


async def _submitted(svc: Services, principal: Principal, cmd: SubmitGeneration, *, request: Request, t0: float,
                     decide_by: float) -> Live:
    """Submits the identified request with its stream followed from before it, and waits
    for the stream's first event (admission's decision, or what came after it)."""
    tenant_id = principal.tenant_id
    hub = svc.hub
    start = hub.position(partition_for(cmd.request_id, hub.partitions))
    sub = hub.subscribe(tenant_id, cmd.request_id)  # before submitting: no event can slip past
    tracker = svc.metrics.track(tenant_id, pool_of(cmd.priority), t0)
    filler = CacheFiller(svc.cache)

    def on_event(event: StreamEvent) -> None:
        tracker.on_event(event)
        filler.on_event(event)
    stream = RequestStream(sub, after=start - 1, on_event=on_event, on_close=tracker.close)
    submitting = asyncio.ensure_future(asyncio.to_thread(
        submit_generation, cmd, principal=principal, registry=svc.registry_view.registry, log=svc.log,
        counter=svc.counter, default_deadline_ms=svc.settings.default_deadline_ms, stream_offset=start,
        fleet=svc.fleet, digests=svc.digests, cache=svc.cache, affinity=svc.settings.work_affinity,
        cooling=svc.ladder.cooling(cmd.model_alias) if cmd.fallback_to is None else frozenset()))
    try:
        try:
            submitted = await outage.within(submitting, decide_by, "The event log", svc.log_watch)
        except ApiError:  # it may reach the log later all the same
            outage.abandon(svc, tenant_id, cmd.request_id, submitting)
            raise
        tracker.describe(submitted.request.model_revision, submitted.request.input_tokens)
        if cmd.idempotency_key_sha256 is not None:
            other = await _after_key_race(svc, stream, submitted)
            if other is not None:
                stream.close()
                return await replay_generation(svc, tenant_id, other, request=request)
        filler.query = submitted.cache_query
        wait_s = _wait_s(svc, submitted.request.deadline_at)
        first = await unless_gone(_first_event(svc, stream, decide_by, wait_s), request)
        if isinstance(first.env.payload, CacheHit) and submitted.cached is not None:
            await asyncio.to_thread(serve_cached, svc, first.env, submitted.cached)
    except ClientGone:
        svc.reaper.client_gone(stream)
        raise
    except StreamTimeout:
        svc.reaper.client_gone(stream)  # nobody will wait for it any more
        raise ApiError(504, "The generation did not start before its deadline", code="timeout") from None
    except _Undecided:
        stream.close()
        outage.abandon(svc, tenant_id, cmd.request_id)
        raise outage.admission_timeout(svc.settings.decision_timeout_s) from None
    except BaseException:
        stream.close()
        raise
    live = _admitted(stream, first, wait_s, replayed=False, revision=submitted.request.model_revision)
    live.request = submitted.request
    return live


async def _tokenizer_loaded(svc: Services, principal: Principal, cmd: SubmitGeneration) -> None:
    """Loads the model's tokenizer, if this is its first request here, before the decision
    bound starts: a first load takes seconds of CPU (more on a busy host), which is neither
    the log's wait nor admission's. A path that fails is reported by the submission."""
    revision = svc.registry_view.registry.resolve_alias(cmd.model_alias, principal.tenant_id)
    if revision is not None and not svc.counter.loaded(revision.model_path):
        await asyncio.to_thread(svc.counter.warm, [revision.model_path])


class CacheFiller:
    """Keeps a generation's text as its stream is handed out and, when it completes, puts
    its answer in the semantic cache under the request's own look (`query`; None: the
    request was not to be cached, or was answered from the cache)."""

    def __init__(self, cache):
        self.cache, self.query = cache, None
        self._text: list[str] = []

    def on_event(self, event: StreamEvent) -> None:
        if self.query is None:
            return
        p = event.env.payload
        if isinstance(p, TokensEmitted):
            self._text.append(p.text)
        elif isinstance(p, GenerationCompleted) and not p.cached:
            self.cache.fill(self.query, answer="".join(self._text), output_tokens=p.output_tokens,
                            input_tokens=p.input_tokens, finish_reason=p.finish_reason,
                            source_request_id=p.request_id)
            self.query = None


def serve_cached(svc: Services, hit_env, entry) -> None:
    """After admission accepted a cache hit (`CacheHit`): the cached answer on the request's
    stream, as one tokens event and a completion saying it was cached, for its client and
    for anyone who reads the stream again."""
    hit: CacheHit = hit_env.payload
    tokens = caused_by(hit_env, TokensEmitted(request_id=hit.request_id, seq=0, text=entry.answer,
                                              token_count=hit.saved_output_tokens))
    done = caused_by(hit_env, GenerationCompleted(
        request_id=hit.request_id, finish_reason=hit.finish_reason, input_tokens=hit.input_tokens,
        output_tokens=hit.saved_output_tokens, model_revision=hit.model_revision,
        output_sha256=svc.digests.hexdigest(hit_env.tenant_id, entry.answer), timings=Timings(), cached=True))
    publish(svc.log, topics.STREAM, [tokens, done])


class _Undecided(Exception):
    """Admission has not decided the request by the decision timeout."""


DECIDED_LOOKUP_S = 2.0  # the most the look at the log for a decision may add to the decision timeout


async def _first_event(svc: Services, stream: RequestStream, decide_by: float, wait_s: float) -> StreamEvent:
    """The request's first stream event. Admitted work may queue for long before a worker
    starts it, so when none came by `decide_by`, the log is asked whether admission decided:
    if it did, waiting goes on (up to `wait_s` in all); if not, `_Undecided`."""
    loop = asyncio.get_running_loop()
    until = loop.time() + wait_s
    try:
        return await stream.next(max(0.0, decide_by - time.monotonic()))
    except StreamTimeout:
        pass
    if not await outage.decided(svc, stream.tenant_id, stream.request_id, timeout_s=DECIDED_LOOKUP_S):
        try:
            return await stream.next(0.05)  # it may have come while the log was asked
        except StreamTimeout:
            raise _Undecided() from None
    return await stream.next(max(0.0, until - loop.time()))


async def _after_key_race(svc: Services, stream: RequestStream, submitted: Submitted) -> str | None:
    """Applies `idempotency.resolve_key_race` to our stream. Returns the id to replay
    instead, if another request won the key."""
    try:
        race = await asyncio.to_thread(idempotency.resolve_key_race, submitted, index=svc.index, log=svc.log)
    except idempotency.KeyReused:
        raise _key_reused() from None
    if isinstance(race, idempotency.Replay):
        return race.request_id
    if isinstance(race, idempotency.SharedRequest):
        # The first request's stream may have begun before ours was submitted: read it from there.
        start = min(race.stream_offset, stream.after + 1)
        stream.after = start - 1
        stream.add_history(await asyncio.to_thread(svc.history.read, submitted.tenant_id, submitted.request.request_id,
                                                   submitted.stream_partition, start))
    return None


def _admitted(stream: RequestStream, first: StreamEvent, wait_s: float, *, replayed: bool,
              revision: str | None = None) -> Live:
    if isinstance(first.env.payload, GenerationRejected):
        stream.close()
        raise rejection_error(first.env.payload, revision)
    return Live(stream, first, asyncio.get_running_loop().time() + wait_s, replayed)


def find_request(svc: Services, tenant_id: str, request_id: str) -> RequestInfo | None:
    return idempotency.find_request(tenant_id, request_id, index=svc.index)


async def replay_generation(svc: Services, tenant_id: str, request_id: str, *, request: Request) -> Live:
    """An existing generation from the start of its retained stream (an idempotent retry)."""
    info = await asyncio.to_thread(svc.index.request, tenant_id, request_id)
    if info is None:
        raise ApiError(404, f"No generation '{request_id}'", code="not_found")
    stream = await open_stream(svc, info, after=None)
    wait_s = _wait_s(svc, info.deadline_at)
    try:
        first = await unless_gone(stream.next(wait_s), request)
    except ClientGone:
        svc.reaper.client_gone(stream)
        raise
    except BaseException:
        stream.close()
        raise
    return _admitted(stream, first, wait_s, replayed=True)


async def open_stream(svc: Services, info: RequestInfo, *, after: int | None) -> RequestStream:
    """The generation's stream from its start (`after` None) or after the offset `after`,
    history first, then live. 410 when the stream topic no longer holds that part."""
    partition = partition_for(info.request_id, svc.hub.partitions)
    sub = svc.hub.subscribe(info.tenant_id, info.request_id)
    start = info.stream_offset
    low = await asyncio.to_thread(svc.history.low_offset, partition)
    if start < low:
        if after is None or after + 1 < low:
            sub.close()
            raise ApiError(410, "This generation's stream is no longer retained", code="stream_expired")
        start = low
    try:
        history = await asyncio.to_thread(svc.history.read, info.tenant_id, info.request_id, partition, start)
    except BaseException:
        sub.close()
        raise
    stream = RequestStream(sub, after=start - 1)
    stream.add_history(history)
    return stream


def wait_s_for(svc: Services, info: RequestInfo) -> float:
    return _wait_s(svc, info.deadline_at)
