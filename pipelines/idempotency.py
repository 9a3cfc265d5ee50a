"""`Idempotency-Key` for generations: the same key and body within 24 h is the same
generation; the same key with another body is a conflict.

The choice, written down: the record is the log itself, no table. A keyed request's
`GenerationRequested` carries `idempotency_key_sha256` (of tenant and key) and
`request_sha256` (of route and body), so every API replica, and an API after a restart,
learns a key's first use by reading the tenant's partition of the requests topic
(`pipelines.request_index`). Being one partition, it orders all uses of a key: the first
by offset is the claim, and that holds across replicas.

Two replicas that both miss the claim (a retry racing its original) still agree: a keyed
request's id is derived from (tenant, key, UTC day of first use), so both submit the
same request id and the admission processor decides it once. Each then re-reads the
partition up to its own record, and a loser with another body gets the 409. The day in
the id only makes a key reusable once its claim has aged out.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from models.events import canonical

WINDOW = timedelta(hours=24)
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")  # printable ASCII, no spaces, as Stripe and OpenAI accept


class IdempotencyKeyInvalid(ValueError):
    pass


def validate_key(key: str) -> str:
    if not _KEY.match(key):
        raise IdempotencyKeyInvalid("Idempotency-Key must be 1 to 255 printable ASCII characters without spaces")
    return key


def _sha(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def key_sha256(tenant_id: str, key: str) -> str:
    """The key as stored on the log: hashed with its tenant, so equal keys of two tenants differ."""
    return _sha("idempotency-key", tenant_id, key)


def request_sha256(route: str, body: dict) -> str:
    """What 'the same body' means: the route and the parsed body in canonical JSON."""
    return _sha("request", route, canonical(body).decode())


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
