"""The hash chain of one topic-partition.

    event_hash = sha256(record value as stored)      (the canonical bytes of the event)
    link[n]    = sha256(link[n-1] + event_hash[n])    link[0] = genesis(topic, partition)

The genesis binds a chain to its topic and partition, so a chain cannot be passed off as
another partition's. Changing, removing, adding or reordering any record changes every
link from there on; a signed checkpoint of a link pins everything before it.
"""
from __future__ import annotations

import hashlib

VERSION = b"ledgerlm-audit-chain-v1"
# Records per partition between signed checkpoints. Counted in records, never in time,
# so a replay signs exactly the heads the live trail signed.
CHECKPOINT_EVERY = 1000
# Types that carry prompt or completion text. They belong on bounded topics only; should
# one reach a durable topic it is still chained, but its text is not copied to the trail.
TEXT_TYPES = frozenset({"PromptSubmitted", "TokensEmitted"})


def genesis(topic: str, partition: int) -> bytes:
    return hashlib.sha256(VERSION + b"\0" + topic.encode() + b"\0" + str(partition).encode()).digest()


def event_hash(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def next_link(previous: bytes, hashed: bytes) -> bytes:
    return hashlib.sha256(previous + hashed).digest()
