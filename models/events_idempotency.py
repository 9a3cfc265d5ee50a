"""Events of `Idempotency-Key` on files, batches, summarizations and cancels
(`pipelines.idempotency_keys`). They live on the durable `ledgerlm.batches` topic, keyed by
tenant: the tenant's partition orders every use of a key, on every API replica."""
from __future__ import annotations

from typing import Any

from models.event_types import Payload, event


@event("IdempotencyKeyClaimed")
class IdempotencyKeyClaimed(Payload):
    """A keyed request is about to run: the first live claim of a key is the one that runs.
    Both hashes are keyed with the tenant (no key or body can be read back from them)."""

    claim_id: str
    key_sha256: str
    request_sha256: str


@event("IdempotentResponseRecorded")
class IdempotentResponseRecorded(Payload):
    """What a claimed request answered, given again to every retry within the window.
    Only object metadata (ids, counts, names), never prompt or document text."""

    claim_id: str
    key_sha256: str
    response: dict[str, Any]


@event("IdempotencyKeyReleased")
class IdempotencyKeyReleased(Payload):
    """A claimed request failed without doing anything: the key is free again."""

    claim_id: str
    key_sha256: str
