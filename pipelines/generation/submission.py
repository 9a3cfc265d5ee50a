"""Submitting a generation: the prompt goes to the bounded-retention prompts topic, the
text-free request to the durable requests topic, which references it. A client's cancel
goes to the requests topic too."""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Protocol

from models import topics
from models.events import canonical, new_event
from models.digests import TenantDigests
from models.events_generation import (
    CacheRef, CancelRequested, GenerationRequested, Position, PromptSubmitted, Sampling,
)
from models.registry import Principal, Registry, Revision
from models.router import RouteAsk, choose
from models.rollout import ARM_CANDIDATE, ARM_STABLE, SHADOW_TENANT, stickiness_key
from pipelines.eventlog import EventLog
from pipelines.publish import partition_of, publish
from pipelines.generation.tokencount import (
    ChatTemplateMissing, TokenCounter, TokenizerUnavailable, chat_template_missing,
)

# A generation's statuses (the generations projection's words) that it never leaves.
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "expired", "rejected"})


class SubmissionError(ValueError):
    """`model_revision`: the revision refused for capacity, which the overload ladder may
    fall back from (`api.live`)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 retry_after_s: int | None = None, model_revision: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param, self.retry_after_s = status, code, param, retry_after_s
        self.model_revision = model_revision


class Fleet(Protocol):
    """The live fleet as the API sees it (`pipelines.fleet.FleetView`). A fleet may also say
    which workers serve (`serving(pool=..., revision=...)`, their `WorkerState`s), whose KV
    caches bound the largest request admitted (`largest_kv`)."""

    def serves_soon(self, pool: str, revision: str) -> bool:
        """Whether a live worker of `pool` serves `revision`."""


logger = logging.getLogger(__name__)

# How soon a client refused for want of a worker may try again: about a worker's start.
NO_CAPACITY_RETRY_S = 5
MODEL_UNAVAILABLE_RETRY_S = 60  # an operator has to fix the revision's files first


@dataclass(frozen=True)
class SubmitGeneration:
    request_id: str | None
    model_alias: str
    prompt: str | None  # the text as given, or None when `messages` are to be templated
    max_output_tokens: int | None  # None: whatever the model's context leaves after the input
    deadline_ms: int | None
    priority: str = "normal"
    sampling: Sampling = Sampling()
    route: str = "generations"
    messages: tuple[dict, ...] | None = None  # chat messages [{role, content: str}], templated by the model
    idempotency_key_sha256: str | None = None
    request_sha256: str | None = None
    user: str | None = None  # the caller's end user, if named: the stickiness key of a rollout
    tag: str | None = None  # the request's routing tag (header `X-Route-Tag`), for a router's static rules
    # The overload ladder's downgrade: this revision (one of the router's fallbacks), for
    # the request named, which was refused for capacity.
    fallback_to: str | None = None
    fallback_from: str | None = None
    # The request_id its client chose, kept on the request so answers can echo it
    # (`request_id` becomes the id on the log derived from it).
    chosen_request_id: str | None = None


@dataclass(frozen=True)
class Submitted:
    request: GenerationRequested
    tenant_id: str
    stream_partition: int
    request_offset: int  # of the GenerationRequested in the tenant's requests partition
    cache_query: object | None = None  # `pipelines.cache.semantic.CacheQuery`: its answer may fill the cache
    cached: object | None = None  # the cache `Entry` it is to be answered from (`request.cache` names it)


def cache_subject(cmd: SubmitGeneration) -> tuple[str, object] | None:
    """What of a request the semantic cache embeds, and all else that shapes its answer
    (the exact partition's part): a prompt and nothing else, or a chat's last user turn and
    every message before it. None for a chat whose last message is not the user's."""
    if cmd.messages is None:
        return cmd.prompt or "", {"kind": "text"}
    *prior, last = cmd.messages
    if last.get("role") != "user":
        return None
    return last.get("content") or "", {"kind": "chat", "prior": prior}


# A text prompt longer than this shares its first this many characters with the prompts
# it is placed beside (`prefix_affinity`): about 256 tokens, enough to be worth a worker's cache.
AFFINITY_PREFIX_CHARS = 1024


def prefix_affinity(cmd: SubmitGeneration, tenant_id: str, digests: TenantDigests) -> str | None:
    """What a request shares with others whose prompts start the same way, as a keyed
    digest (no text on the durable log): a chat's messages before its last one (system
    prompt and prior turns), a long text prompt's leading characters. Admission places
    requests that share it on one work partition while that keeps the pool balanced
    (`pipelines.admission.placement`). None for a lone chat turn or a short prompt: nothing shared."""
    if cmd.messages is not None:
        shared = canonical({"prior": list(cmd.messages[:-1])}).decode() if len(cmd.messages) > 1 else None
    else:
        text = cmd.prompt or ""
        shared = text[:AFFINITY_PREFIX_CHARS] if len(text) > AFFINITY_PREFIX_CHARS else None
    return None if shared is None else digests.hexdigest(tenant_id, "affinity\0" + shared)[:32]


def submit_generation(
    cmd: SubmitGeneration, *, principal: Principal, registry: Registry, log: EventLog, counter: TokenCounter,
    default_deadline_ms: int, stream_offset: int | None = None, fleet: Fleet | None = None,
    digests: TenantDigests | None = None, cache=None, cooling: frozenset[str] = frozenset(), affinity: bool = True,
) -> Submitted:
    """`stream_offset`: a known lower bound of where the request's stream will start in its
    partition (the API's stream follower has one); the partition's end is read otherwise.
    `fleet`: where the live workers are known; a revision no live worker serves is refused
    (503) before anything is written, rather than left to wait until its deadline.
    `digests`: the keys of the prompt's digest (`TenantDigests.from_settings`; the defaults' otherwise).
    `cache`: the API's semantic cache (`pipelines.cache.semantic.AnswerCache`): a hit is
    submitted naming its entry, which admission answers without an engine, so it needs no
    live worker either. `cooling`: revisions of the alias refused for capacity a moment ago
    (`api.ladder`): a router sends a request it would route there to its first fallback
    that is not cooling instead. `affinity`: whether the request names what its prompt
    shares with others (`prefix_affinity`), for admission to place it by."""
    route, revision = _routed(cmd, principal, registry, fleet)
    pick, subject = _pick(cmd, principal, registry, counter, route, revision, cooling)
    max_output_tokens = _fits(cmd, registry, principal.tenant_id, pick.revision, pick.input_tokens, fleet)
    query, entry, hit = None, None, None
    if cache is not None and subject is not None:
        query, entry, hit = _look_up(cache, subject, registry, principal.tenant_id, cmd, pick.revision.model_revision,
                                     max_output_tokens)
    if entry is None and pick.cool_to is not None:  # no hit: down to the smaller revision
        fallback = registry.pinnable(pick.cool_to)
        pick = _Pick(fallback, *_prompt_for(cmd, counter, fallback), rule="fallback",
                     fallback_from=pick.revision.model_revision)
        max_output_tokens = _fits(cmd, registry, principal.tenant_id, pick.revision, pick.input_tokens, fleet)
        query = None  # its answer is the fallback's, not what the cache was asked for
    if fleet is not None and entry is None:
        _served_now(cmd, registry.limits_for(principal.tenant_id).pool or topics.SHARED_POOL, pick.revision, fleet)
    request, stream_partition, request_offset = _write(
        cmd, principal, log, pick, route=route, max_output_tokens=max_output_tokens, hit=hit,
        stream_offset=stream_offset, default_deadline_ms=default_deadline_ms,
        digests=digests or TenantDigests.development(), affinity=affinity)
    rollout = registry.open_rollouts.get(cmd.model_alias) if route is not None and route.rollout_id else None
    mirrored = rollout is not None and entry is None
    if mirrored and rollout.mirrors(stickiness_key(principal.tenant_id, principal.application_id, cmd.user)):
        _mirror(request, rollout, prompt=pick.prompt, registry=registry, log=log, counter=counter, fleet=fleet)
    return Submitted(request=request, tenant_id=principal.tenant_id, stream_partition=stream_partition,
                     request_offset=request_offset, cache_query=query if entry is None else None,
                     cached=entry)


@dataclass(frozen=True)
class _Pick:
    """The revision a request goes to, its prompt as that revision's model sees it, and why
    it goes there: the router's rule and the revision it fell back from (None: neither).
    `cool_to`: the fallback to take instead, unless the cache answers (`api.ladder`)."""

    revision: Revision
    prompt: str
    input_tokens: int
    rule: str | None = None
    fallback_from: str | None = None
    cool_to: str | None = None


def _routed(cmd: SubmitGeneration, principal: Principal, registry: Registry, fleet: Fleet | None):
    """The alias's route for this caller (an open rollout's arm included) and the revision
    it pins; raises where the tenant may not send the priority, or the alias names no
    revision that may be pinned."""
    if cmd.priority == "high" and not registry.limits_for(principal.tenant_id).may_send_high:
        raise SubmissionError(403, "priority_not_allowed", "This tenant may not send priority 'high'; an admin "
                              "grants it (limit may_send_high)", "priority")
    route = registry.route(cmd.model_alias, principal.tenant_id,
                           stickiness_key(principal.tenant_id, principal.application_id, cmd.user))
    if route is not None and route.arm == ARM_CANDIDATE and fleet is not None and not fleet.serves_soon(
            registry.limits_for(principal.tenant_id).pool or topics.SHARED_POOL, route.model_revision):
        # No traffic to a candidate nobody serves: its callers stay on stable meanwhile.
        route = replace(route, model_revision=registry.open_rollouts[cmd.model_alias].stable_revision, arm=ARM_STABLE)
    revision = None if route is None else registry.pinnable(route.model_revision)
    retired = registry.retired_behind(cmd.model_alias, principal.tenant_id) if revision is None else None
    if retired is not None:
        # Gone on purpose, unlike a typo (404) or load (503): retrying will not help until
        # an admin points the alias at another revision.
        why = registry.retired[retired]
        raise SubmissionError(410, "model_retired", f"The model '{cmd.model_alias}' points at revision {retired}, "
                              f"which is retired{': ' + why if why else ''}", "model")
    if revision is None:
        raise SubmissionError(404, "model_not_found", f"The model '{cmd.model_alias}' does not exist", "model")
    return route, revision


def _pick(cmd: SubmitGeneration, principal: Principal, registry: Registry, counter: TokenCounter, route,
          revision: Revision, cooling: frozenset[str]) -> tuple[_Pick, tuple[str, object] | None]:
    """Where the alias's router (if it has one, and no open rollout routes first) sends the
    request: the revision its rules choose, or the overload ladder's fallback; and what of
    the request the semantic cache would embed (`cache_subject`)."""
    prompt, input_tokens = _prompt_for(cmd, counter, revision)
    subject = cache_subject(cmd)
    rule, cool_to = None, None
    router = registry.routers.get(cmd.model_alias)
    if router is not None and route.rollout_id is None:  # an open rollout's table comes first
        if cmd.fallback_to is not None:
            chosen, rule = cmd.fallback_to, "fallback"
        else:
            choice = choose(registry, router.rules, revision.model_revision, RouteAsk(
                principal.tenant_id, principal.application_id, cmd.route, cmd.tag, input_tokens,
                subject[0] if subject else prompt))
            chosen, rule = choice.revision, choice.rule
            if chosen in cooling:  # the ladder: after a cache hit is looked for
                cool_to = next((r for r in router.fallbacks if r not in cooling and r != chosen
                                and registry.pinnable(r) is not None), None)
        if chosen != revision.model_revision and registry.pinnable(chosen) is not None:
            revision = registry.pinnable(chosen)
            prompt, input_tokens = _prompt_for(cmd, counter, revision)
    return _Pick(revision, prompt, input_tokens, rule=rule, fallback_from=cmd.fallback_from, cool_to=cool_to), subject


def _served_now(cmd: SubmitGeneration, pool: str, revision: Revision, fleet: Fleet) -> None:
    """Raises (503) where no live worker of `pool` serves `revision`."""
    if not fleet.serves_soon(pool, revision.model_revision):
        raise SubmissionError(503, "no_capacity", f"No worker serves the model '{cmd.model_alias}' "
                              f"(revision {revision.model_revision}) now; try again shortly", "model",
                              retry_after_s=NO_CAPACITY_RETRY_S, model_revision=revision.model_revision)


def _write(cmd: SubmitGeneration, principal: Principal, log: EventLog, pick: _Pick, *, route,
           max_output_tokens: int, hit: CacheRef | None, stream_offset: int | None, default_deadline_ms: int,
           digests: TenantDigests, affinity: bool) -> tuple[GenerationRequested, int, int]:
    """Puts the prompt on the prompts topic and the request, referencing it, on the requests
    topic. Returns the request, its stream partition and its offset in the requests topic."""
    request_id = cmd.request_id or "gen_" + uuid.uuid4().hex
    deadline_ms = cmd.deadline_ms if cmd.deadline_ms is not None else default_deadline_ms
    deadline_at = datetime.now(timezone.utc) + timedelta(milliseconds=deadline_ms)
    stream_partition = partition_of(log, topics.STREAM, request_id)
    if stream_offset is None:
        stream_offset = log.end_offset(topics.STREAM.name, stream_partition)
    prompt_env = new_event(PromptSubmitted(request_id=request_id, prompt=pick.prompt),
                           tenant_id=principal.tenant_id, correlation_id=request_id)
    [prompt_record] = publish(log, topics.PROMPTS, [prompt_env])
    request = GenerationRequested(
        request_id=request_id, application_id=principal.application_id, key_id=principal.key_id,
        model_alias=cmd.model_alias, model_revision=pick.revision.model_revision, input_tokens=pick.input_tokens,
        input_sha256=digests.hexdigest(principal.tenant_id, pick.prompt),
        max_output_tokens=max_output_tokens,
        deadline_at=deadline_at, priority=cmd.priority, sampling=cmd.sampling,
        prompt_ref=Position(topic=prompt_record.topic, partition=prompt_record.partition, offset=prompt_record.offset),
        stream_offset=stream_offset, route=cmd.route, idempotency_key_sha256=cmd.idempotency_key_sha256,
        request_sha256=cmd.request_sha256, rollout_id=route.rollout_id, rollout_arm=route.arm,
        cache=hit, route_rule=pick.rule, fallback_from=pick.fallback_from,
        affinity=prefix_affinity(cmd, principal.tenant_id, digests) if affinity else None,
        chosen_request_id=cmd.chosen_request_id,
    )
    [request_record] = publish(log, topics.REQUESTS, [new_event(
        request, tenant_id=principal.tenant_id, correlation_id=request_id, causation_id=str(prompt_env.event_id))])
    return request, stream_partition, request_record.offset


def _mirror(request: GenerationRequested, rollout, *, prompt: str, registry: Registry, log: EventLog,
            counter: TokenCounter, fleet: Fleet | None) -> str | None:
    """A shadow copy of `request` for the rollout's candidate, under the platform's shadow
    account; returns its id. Never the client's concern: a copy that cannot be made (no
    worker of the candidate, a tokenizer, the log) is left out, and admission drops one the
    candidate has no free slot for (`pipelines.admission.admit`)."""
    candidate = registry.pinnable(rollout.candidate_revision)
    if candidate is None or (fleet is not None and not fleet.serves_soon(topics.SHARED_POOL, candidate.model_revision)):
        return None
    shadow_id = f"{request.request_id}.shadow"
    try:
        input_tokens = counter.count(candidate.model_path, prompt)
        if input_tokens + request.max_output_tokens > candidate.max_model_len:
            return None
        shadow = request.model_copy(update=dict(
            request_id=shadow_id, key_id=None, model_revision=candidate.model_revision, input_tokens=input_tokens,
            stream_offset=log.end_offset(topics.STREAM.name, partition_of(log, topics.STREAM, shadow_id)),
            idempotency_key_sha256=None, request_sha256=None, rollout_arm=ARM_CANDIDATE,
            shadow_of=request.request_id))
        publish(log, topics.REQUESTS, [new_event(shadow, tenant_id=SHADOW_TENANT, correlation_id=shadow_id)])
    except Exception:  # noqa: BLE001 - the copy is best effort; the client's request stands
        logger.warning("no shadow copy of %s for %s", request.request_id, rollout.rollout_id, exc_info=True)
        return None
    return shadow_id


def _look_up(cache, subject: tuple[str, object], registry: Registry, tenant_id: str, cmd: SubmitGeneration,
             revision: str, max_output_tokens: int):
    """The request's look at the semantic cache (None where its policy has the cache off or
    its sampling is not cacheable), and on a hit its entry and the reference to pin."""
    query = cache.query(registry, tenant_id=tenant_id, alias=cmd.model_alias, revision=revision, text=subject[0],
                        context=subject[1], sampling={**cmd.sampling.model_dump(),
                                                      "max_output_tokens": max_output_tokens})
    found = cache.find(query) if query is not None else None
    if found is None or found.entry is None:
        return query, None, None
    entry = found.entry
    return query, entry, CacheRef(entry_id=entry.entry_id, source_request_id=entry.source_request_id,
                                  similarity=found.similarity, threshold=found.threshold,
                                  output_tokens=entry.output_tokens, finish_reason=entry.finish_reason)


def _fits(cmd: SubmitGeneration, registry: Registry, tenant_id: str, revision, input_tokens: int,
          fleet: Fleet | None = None) -> int:
    """The request's output limit on this revision; raises when its context, or the KV cache
    of every live worker of the revision, cannot hold it (`largest_kv`)."""
    if input_tokens >= revision.max_model_len:
        raise SubmissionError(413, "context_length_exceeded", f"{input_tokens} input tokens leave no room for "
                              f"output in this model's context of {revision.max_model_len}", "input")
    kv = largest_kv(fleet, registry.limits_for(tenant_id).pool or topics.SHARED_POOL, revision.model_revision)
    if kv is not None and input_tokens >= kv:
        raise SubmissionError(400, "context_length_exceeded", f"{input_tokens} input tokens leave no room for output "
                              f"in the KV cache of any live worker of revision {revision.model_revision} (the "
                              f"largest holds {kv} tokens, prompt and output together)", "input")
    room = _room_for_output(registry, tenant_id, revision, input_tokens)
    max_output_tokens = cmd.max_output_tokens or (room if kv is None else min(room, kv - input_tokens))
    if input_tokens + max_output_tokens > revision.max_model_len:
        raise SubmissionError(
            400, "context_length_exceeded",
            f"{input_tokens} input tokens + {max_output_tokens} output tokens exceed this model's "
            f"context of {revision.max_model_len}", "max_tokens")
    if kv is not None and input_tokens + max_output_tokens > kv:
        raise SubmissionError(
            400, "context_length_exceeded",
            f"{input_tokens} input tokens + {max_output_tokens} output tokens = {input_tokens + max_output_tokens} "
            f"exceed the KV cache of every live worker of revision {revision.model_revision}: the largest holds "
            f"{kv} tokens, so the largest request that fits is {kv} tokens (with this prompt, max_tokens "
            f"{kv - input_tokens} at most)", "max_tokens")
    return max_output_tokens


def largest_kv(fleet: Fleet | None, pool: str, revision: str) -> int | None:
    """The KV-cache tokens of the largest live worker of `pool` serving `revision`: the most a
    request (prompt plus max output) may claim, as it runs there alone when it must. None
    where that is not known: no fleet, no worker serving yet, or one that reports no KV."""
    serving = getattr(fleet, "serving", None)
    if serving is None:
        return None
    sizes = [w.capacity.kv_cache_tokens for w in serving(pool=pool, revision=revision)]
    return max(sizes) if sizes and min(sizes) > 0 else None


def _prompt_for(cmd: SubmitGeneration, counter: TokenCounter, revision) -> tuple[str, int]:
    """The request's prompt as the revision's model sees it, and its input tokens."""
    try:
        prompt = cmd.prompt if cmd.messages is None else _templated(counter, revision, cmd.messages)
        return prompt, counter.count(revision.model_path, prompt)
    except TokenizerUnavailable as exc:
        # The revision's files cannot be read here (an approval naming a path that is not
        # there): the platform's fault, not the request's, and no crash either.
        raise SubmissionError(503, "model_unavailable", f"The model '{cmd.model_alias}' cannot be loaded now ({exc})",
                              "model", retry_after_s=MODEL_UNAVAILABLE_RETRY_S) from None


def _room_for_output(registry: Registry, tenant_id: str, revision, input_tokens: int) -> int:
    """No max given: what the context leaves, within the tenant's own output limit."""
    room = revision.max_model_len - input_tokens
    limit = registry.limits_for(tenant_id).max_output_tokens
    return min(room, limit) if limit else room


def _templated(counter: TokenCounter, revision, messages: tuple[dict, ...]) -> str:
    try:
        return counter.chat_prompt(revision.model_path, list(messages))
    except TokenizerUnavailable:
        raise
    except ChatTemplateMissing:
        raise SubmissionError(400, "chat_template_missing", chat_template_missing(revision.model_revision),
                              "messages") from None
    except Exception as exc:  # a template may refuse a message order (e.g. two system messages)
        raise SubmissionError(400, "invalid_messages", f"The messages cannot be templated for this model: "
                              f"{type(exc).__name__}", "messages") from None


def request_cancel(tenant_id: str, request_id: str, *, known_status: str | None, log: EventLog) -> bool:
    """A client's cancel, unless the generation is known to be over. It goes on the log
    before its status is read for the answer: it races the generation. Returns whether
    it was put on the log."""
    if known_status in TERMINAL_STATUSES:
        return False
    env = new_event(CancelRequested(request_id=request_id, reason="client"), tenant_id=tenant_id,
                    correlation_id=request_id)
    publish(log, topics.REQUESTS, [env])
    return True
