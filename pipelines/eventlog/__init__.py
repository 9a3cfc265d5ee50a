"""The event log port, and `open_event_log` choosing an adapter by URL scheme."""
from __future__ import annotations

from pathlib import Path

from pipelines.eventlog.base import (
    EventLog, EventLogError, Fenced, GroupConsumer, Message, Record, TopicPartition, TopicSpec, UnknownTopic,
    partition_for,
)

__all__ = [
    "EventLog", "EventLogError", "Fenced", "GroupConsumer", "Message", "Record", "TopicPartition", "TopicSpec",
    "UnknownTopic", "partition_for", "open_event_log",
]


def open_event_log(url: str, **options) -> EventLog:
    """`kafka://host:port[,host:port]` or `sqlite:///relative/path.db` (`sqlite:////absolute`).

    `options` go to the adapter's constructor (timeouts, group settings).
    """
    if url.startswith("kafka://"):
        servers = [s for s in url[len("kafka://"):].rstrip("/").split(",") if s]
        if not servers:
            raise ValueError(f"event log URL {url!r} names no broker; expected kafka://host:port[,host:port]")
        from pipelines.eventlog.kafka import KafkaEventLog  # imported here so sqlite users never load kafka

        return KafkaEventLog(servers, **options)
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        from pipelines.eventlog.embedded import EmbeddedEventLog

        path = Path(url[len("sqlite:///"):])
        path.parent.mkdir(parents=True, exist_ok=True)
        return EmbeddedEventLog(path, **options)
    raise ValueError(
        f"unsupported event log URL {url!r}; expected kafka://host:port[,host:port] or sqlite:///path/to/log.db")
