"""`Idempotency-Key` for requests that make or change objects other than generations:
file uploads, batch and summarization creation, and cancels. The same key and body
within 24 h answer what the first answered (same object, nothing done again); the same
key with another body is a conflict.

The choice, written down: the record is the log, no table. Claims and answers are
events on the batches topic, which is keyed by tenant, so one partition orders every use
of a tenant's keys, on every API replica and across restarts:

1. A request reads the partition to its end. A live claim of its key with the same body
   and a recorded answer: that answer. Another body: `KeyReused`.
2. None: it appends `IdempotencyKeyClaimed` and reads the partition up to that record.
   The first live claim by offset is the one that runs; a racing loser waits (bounded)
   for the winner's answer.
3. The winner runs, then appends `IdempotentResponseRecorded` (or, when it failed,
   `IdempotencyKeyReleased`, so a retry runs it again).

A claim left without an answer for `PENDING` (its API died mid-request) stops holding the
key, so a retry is not locked out for the whole window. Generations keep their own
record on the requests topic (`pipelines.generation.idempotency`); the key format, its
hash and the body hash are the same.
"""
from __future__ import annotations

import hashlib
import hmac
import re
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from models import topics
from models.events import EventDecodeError, canonical, decode, new_event
from models.events_idempotency import IdempotencyKeyClaimed, IdempotencyKeyReleased, IdempotentResponseRecorded
from pipelines.eventlog import EventLog, partition_for
from pipelines.publish import publish

WINDOW = timedelta(hours=24)
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")  # printable ASCII, no spaces, as Stripe and OpenAI accept


class IdempotencyKeyInvalid(ValueError):
    pass


class KeyReused(Exception):
    """The key was claimed by a request with another body."""


def validate_key(key: str) -> str:
    if not _KEY.match(key):
        raise IdempotencyKeyInvalid("Idempotency-Key must be 1 to 255 printable ASCII characters without spaces")
    return key


def _sha(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def key_sha256(tenant_id: str, key: str) -> str:
    """The key as stored on the log: hashed with its tenant, so equal keys of two tenants differ."""
    return _sha("idempotency-key", tenant_id, key)


def request_sha256(route: str, body: dict, key: bytes | None = None) -> str:
    """What 'the same body' means: the route and the parsed body in canonical JSON. With
    the tenant's digest `key` (models.digests), as the API stores it: the body holds the
    prompt, and a plain hash of it would confirm a guessed one."""
    if key is None:
        return _sha("request", route, canonical(body).decode())
    return hmac.new(key, "\0".join(("request", route, canonical(body).decode())).encode(), hashlib.sha256).hexdigest()


PENDING = timedelta(minutes=2)  # a claim unanswered this long no longer holds its key
_TYPES = (IdempotencyKeyClaimed, IdempotentResponseRecorded, IdempotencyKeyReleased)

class KeyInProgress(Exception):
    """The first request with this key is still running (past the wait)."""


@dataclass
class _Claim:
    claim_id: str
    request_sha256: str
    at: datetime
    offset: int
    response: dict | None = None
    released: bool = False

    def holds(self, now: datetime) -> bool:
        if self.released or now - self.at > WINDOW:
            return False
        return self.response is not None or now - self.at <= PENDING


@dataclass(frozen=True)
class Keyed:
    """A keyed request as the log records it: the tenant, and the key and body hashed."""

    tenant_id: str
    key_sha256: str
    request_sha256: str


@dataclass(frozen=True)
class Answered:
    """The key's first request answered this: give it again."""

    response: dict


@dataclass(frozen=True)
class Mine:
    """This request holds the key: run it, then `record` or `release`."""

    keyed: Keyed
    claim_id: str


def keyed_request(tenant_id: str, key: str, route: str, body: dict, digest_key: bytes | None) -> Keyed:
    """Raises `IdempotencyKeyInvalid` for an empty, over-long or unprintable key."""
    return Keyed(tenant_id, key_sha256(tenant_id, validate_key(key)), request_sha256(route, body, digest_key))


class KeyBook:
    """The claims of recent keys, read from the batches topic on demand (each look reads
    the tenant's partition to its end first, so it sees every replica's writes)."""

    def __init__(self, log: EventLog, *, wait_s: float = 30.0, poll_s: float = 0.1):
        self._log = log
        self._wait_s, self._poll_s = wait_s, poll_s
        self._lock = threading.Lock()
        self._next: dict[int, int] = {}
        self._claims: dict[tuple[str, str], _Claim] = {}  # the live claim of each (tenant, key)
        self._by_id: dict[str, _Claim] = {}

    def begin(self, keyed: Keyed) -> Answered | Mine:
        """Raises `KeyReused` (another body) or `KeyInProgress` (no answer in time)."""
        found = self._live(keyed, datetime.now(timezone.utc))
        if found is None:
            claim_id = "idem_" + uuid.uuid4().hex
            self._append(keyed, IdempotencyKeyClaimed(claim_id=claim_id, key_sha256=keyed.key_sha256,
                                                      request_sha256=keyed.request_sha256), claim_id)
            found = self._live(keyed, datetime.now(timezone.utc))
            if found is None or found.claim_id == claim_id:
                return Mine(keyed, claim_id)
        if found.request_sha256 != keyed.request_sha256:
            raise KeyReused()
        return Answered(self._answer_of(keyed, found))

    def record(self, mine: Mine, response: dict) -> None:
        self._append(mine.keyed, IdempotentResponseRecorded(
            claim_id=mine.claim_id, key_sha256=mine.keyed.key_sha256, response=response), mine.claim_id)

    def release(self, mine: Mine) -> None:
        self._append(mine.keyed, IdempotencyKeyReleased(claim_id=mine.claim_id, key_sha256=mine.keyed.key_sha256),
                     mine.claim_id)

    def _answer_of(self, keyed: Keyed, claim: _Claim) -> dict:
        deadline = time.monotonic() + self._wait_s
        while claim.response is None:
            if claim.released or not claim.holds(datetime.now(timezone.utc)) or time.monotonic() > deadline:
                raise KeyInProgress()
            time.sleep(self._poll_s)  # the first request is still running on some replica
            self._read(keyed.tenant_id)
        return claim.response

    def _append(self, keyed: Keyed, payload, claim_id: str) -> None:
        publish(self._log, topics.BATCHES, [new_event(payload, tenant_id=keyed.tenant_id, correlation_id=claim_id)])

    def _live(self, keyed: Keyed, now: datetime) -> _Claim | None:
        self._read(keyed.tenant_id)
        claim = self._claims.get((keyed.tenant_id, keyed.key_sha256))
        return claim if claim is not None and claim.holds(now) else None

    def _read(self, tenant_id: str) -> None:
        with self._lock:
            partition = partition_for(tenant_id, self._log.partitions(topics.BATCHES.name))
            for record in self._log.read_partition(topics.BATCHES.name, partition, self._next.get(partition, 0)):
                self._next[partition] = record.offset + 1
                try:
                    env = decode(record.value)
                except EventDecodeError:
                    continue  # the dispatcher counts and logs unreadable records
                if isinstance(env.payload, _TYPES):
                    self._fold(env, record.offset)

    def _fold(self, env, offset: int) -> None:
        p, at = env.payload, env.occurred_at
        if isinstance(p, IdempotencyKeyClaimed):
            key = (env.tenant_id, p.key_sha256)
            current = self._claims.get(key)
            if current is None or not current.holds(at):  # the first live claim by offset holds the key
                claim = _Claim(p.claim_id, p.request_sha256, at, offset)
                self._claims[key] = self._by_id[p.claim_id] = claim
            return
        claim = self._by_id.get(p.claim_id)
        if claim is None:
            return
        if isinstance(p, IdempotentResponseRecorded):
            claim.response = claim.response if claim.response is not None else p.response
        else:
            claim.released = claim.response is None
