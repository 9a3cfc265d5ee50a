"""`Idempotency-Key` for generations: the same key and body within 24 h is the same
generation; the same key with another body is a conflict.

The choice, written down: the record is the log itself, no table. A keyed request's
`GenerationRequested` carries `idempotency_key_sha256` (of tenant and key) and
`request_sha256` (of route and body), so every API replica, and an API after a restart,
learns a key's first use by reading the tenant's partition of the requests topic
(`pipelines.generation.request_index`). Being one partition, it orders all uses of a key: the first
by offset is the claim, and that holds across replicas.

Two replicas that both miss the claim (a retry racing its original) still agree: a keyed
request's id is derived from (tenant, key, UTC day of first use), so both submit the
same request id and the admission processor decides it once. Each then re-reads the
partition up to its own record, and a loser with another body gets the 409. The day in
the id only makes a key reusable once its claim has aged out.

`identify` (before submitting) and `resolve_key_race` (after) are the two steps a
submission takes; the API only translates their answers into HTTP.
"""
from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from pipelines.eventlog import EventLog
from pipelines.idempotency_keys import (  # noqa: F401 - the shared rules, kept importable here
    WINDOW, IdempotencyKeyInvalid, KeyReused, _sha, key_sha256, request_sha256, validate_key,
)
from pipelines.generation.submission import SubmitGeneration, Submitted, request_cancel

if TYPE_CHECKING:  # the index imports this module for `Claim` and `WINDOW`
    from pipelines.generation.request_index import RequestInfo


class RequestIdInUse(Exception):
    """A generation (`existing`, its id on the log) already has the request_id its client chose."""

    def __init__(self, chosen: str, existing: str):
        super().__init__(chosen)
        self.chosen, self.existing = chosen, existing


def client_request_id(tenant_id: str, request_id: str) -> str:
    """The id on the log of a generation whose client chose `request_id`. Clients of two
    tenants may choose the same one; the log (admission, workers, vLLM) needs ids unique
    across tenants, so the tenant goes into it. The API accepts either form."""
    return "gen_" + _sha("client-request-id", tenant_id, request_id)[:32]


def keyed_request_id(prefix: str, tenant_id: str, key: str, now: datetime) -> str:
    day = now.strftime("%Y-%m-%d")
    return prefix + _sha("request-id", tenant_id, key, day)[:32]


@dataclass(frozen=True)
class Claim:
    """The first request that used a key, as the requests topic records it."""

    request_id: str
    request_sha256: str | None
    at: datetime
    offset: int


class Decision(Enum):
    NEW = "new"  # no live claim: submit
    REPLAY = "replay"  # same key, same body, within the window: the claimed generation
    CONFLICT = "conflict"  # same key, another body


def decide(claim: Claim | None, body_sha256: str, now: datetime) -> Decision:
    if claim is None or now - claim.at > WINDOW:
        return Decision.NEW
    return Decision.REPLAY if claim.request_sha256 == body_sha256 else Decision.CONFLICT


class RequestLookup(Protocol):
    """What these rules read of recent generations (`pipelines.generation.request_index.RequestIndex`)."""

    def request(self, tenant_id: str, request_id: str) -> RequestInfo | None: ...

    def claim(self, tenant_id: str, key_sha256: str, *, up_to: int | None = None) -> Claim | None: ...


@dataclass(frozen=True)
class Replay:
    """The request means an earlier generation: answer with that one, submit nothing."""

    request_id: str


@dataclass(frozen=True)
class SharedRequest:
    """A racing request with the same key and id was submitted first: admission decides the
    id once, by that one, whose stream begins at `stream_offset`."""

    stream_offset: int


def identify(cmd: SubmitGeneration, *, tenant_id: str, body: dict, idempotency_key: str | None, id_prefix: str,
             index: RequestLookup, now: datetime, digests=None) -> SubmitGeneration | Replay:
    """Before submitting: the command with its ids (request id, key and body hashes), or
    the earlier generation an idempotent retry means. Raises `IdempotencyKeyInvalid`,
    `KeyReused` or `RequestIdInUse`."""
    chosen = cmd.request_id
    if chosen is not None:
        # A fallback's id is its client's with a suffix: the client's own stays the one echoed.
        cmd = replace(cmd, request_id=client_request_id(tenant_id, chosen),
                      chosen_request_id=cmd.chosen_request_id or chosen)
    if idempotency_key is not None:
        key_sha = key_sha256(tenant_id, validate_key(idempotency_key))
        body_sha = request_sha256(cmd.route, body, digests.key_for(tenant_id) if digests is not None else None)
        claim = index.claim(tenant_id, key_sha)
        decision = decide(claim, body_sha, now)
        if decision is Decision.CONFLICT:
            raise KeyReused()
        served = _served_by_fallback(tenant_id, idempotency_key, body_sha, index, now) if not cmd.fallback_to else None
        if served is not None:
            return served
        if decision is Decision.REPLAY:
            return Replay(claim.request_id)
        cmd = replace(cmd, idempotency_key_sha256=key_sha, request_sha256=body_sha, request_id=cmd.request_id
                      or keyed_request_id(id_prefix, tenant_id, idempotency_key, now))
    elif chosen is not None and index.request(tenant_id, cmd.request_id):
        raise RequestIdInUse(chosen, cmd.request_id)
    return cmd if cmd.request_id else replace(cmd, request_id=id_prefix + uuid.uuid4().hex)


MAX_FALLBACKS = 4  # the most fallback steps of one keyed request a retry looks for


def fallback_key(key: str, step: int) -> str:
    """The key the overload ladder's `step`th fallback of a keyed request is submitted
    under, so that a retry finds the generation a fallback served (a valid key itself)."""
    return f"fallback{step}-" + hashlib.sha256(key.encode()).hexdigest()


def _served_by_fallback(tenant_id: str, key: str, body_sha: str, index: RequestLookup, now: datetime) -> Replay | None:
    """The last fallback the ladder made for this key, if it made one: its request (refused
    for capacity, or never on the log) was answered by that generation. Raises `KeyReused`
    where that fallback had another body."""
    for step in range(MAX_FALLBACKS, 0, -1):
        claim = index.claim(tenant_id, key_sha256(tenant_id, fallback_key(key, step)))
        decision = decide(claim, body_sha, now)
        if decision is Decision.CONFLICT:  # the fallback holds the key for its body
            raise KeyReused()
        if decision is Decision.REPLAY:
            return Replay(claim.request_id)
    return None


def resolve_key_race(submitted: Submitted, *, index: RequestLookup, log: EventLog) -> Replay | SharedRequest | None:
    """After a keyed submission: whether another request claimed the key first (another
    replica, or a retry racing its original). None: ours is the claim. Raises `KeyReused`
    when the first had another body."""
    req = submitted.request
    claim = index.claim(submitted.tenant_id, req.idempotency_key_sha256, up_to=submitted.request_offset)
    if claim is None or claim.offset == submitted.request_offset:
        return None
    if claim.request_id != req.request_id:
        # Not the same id (the race straddled midnight UTC): ours would run too, so stop it.
        request_cancel(submitted.tenant_id, req.request_id, known_status=None, log=log)
    if claim.request_sha256 != req.request_sha256:
        raise KeyReused()
    if claim.request_id != req.request_id:
        return Replay(claim.request_id)
    return SharedRequest(index.request(submitted.tenant_id, req.request_id).stream_offset)


def meant_ids(tenant_id: str, request_id: str) -> tuple[str, str]:
    """The ids an id given by a client may mean, in order: a generation's own id, or the
    one whose client chose it."""
    return request_id, client_request_id(tenant_id, request_id)


def find_request(tenant_id: str, request_id: str, *, index: RequestLookup) -> RequestInfo | None:
    """A generation of this tenant by its id, or by the request_id its client chose."""
    for candidate in meant_ids(tenant_id, request_id):
        info = index.request(tenant_id, candidate)
        if info is not None:
            return info
    return None
