"""Turns events into log messages: the key (and so the partition) follows from the topic."""
from __future__ import annotations

from typing import Iterable, Sequence

from models.events import Envelope, encode
from models.topics import Topic
from pipelines.eventlog import EventLog, Message, Record, partition_for

Outputs = list[tuple[Topic, Envelope]]


def key_for(topic: Topic, env: Envelope) -> str:
    # Tenant-keyed topics keep one tenant's events ordered for its single writer;
    # request-keyed topics keep one request's stream in one partition, and spread a
    # revision's work over all its workers (the correlation id is the request id).
    return env.tenant_id if topic.keyed_by == "tenant" else env.correlation_id


def to_message(topic: Topic, env: Envelope) -> Message:
    # Work admission placed on a partition (`pipelines.admission.placement`) goes there, whatever its key.
    partition = getattr(env.payload, "work_partition", None)
    return Message(key=key_for(topic, env), value=encode(env), partition=partition)


def beside(topic: Topic, env: Envelope, partition: int) -> tuple[str, Message]:
    """`env` for `topic`'s `partition`, whatever its key says: a mark written next to the
    item it marks, so a later owner of that partition sees both (even where the topic's
    keying changed, or its partitions grew, after the item was written)."""
    return topic.name, Message(key=key_for(topic, env), value=encode(env), partition=partition)


def to_outputs(outputs: Iterable[tuple[Topic, Envelope]]) -> list[tuple[str, Message]]:
    return [(topic.name, to_message(topic, env)) for topic, env in outputs]


def publish(log: EventLog, topic: Topic, events: Sequence[Envelope]) -> list[Record]:
    return log.append(topic.name, [to_message(topic, env) for env in events])


def partition_of(log: EventLog, topic: Topic, key: str) -> int:
    return partition_for(key, log.partitions(topic.name))
