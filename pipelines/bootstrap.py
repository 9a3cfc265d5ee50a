"""The one place that turns settings into adapters. Entrypoints call these; nothing
connects to anything at import time."""
from __future__ import annotations

from models import topics
from models.settings import Settings
from pipelines.eventlog import EventLog, TopicSpec, open_event_log
from pipelines.eventlog.namespaced import NamespacedEventLog


def topic_specs() -> list[TopicSpec]:
    return [TopicSpec(t.name, t.partitions, t.retention_ms) for t in topics.ALL]


def open_log(settings: Settings, *, create_topics: bool = True) -> EventLog:
    if settings.event_log_url.startswith("sqlite:///"):
        settings.ensure_home()
    log = open_event_log(settings.event_log_url)
    if settings.event_log_namespace:
        log = NamespacedEventLog(log, settings.event_log_namespace)
    if create_topics:
        log.ensure_topics(topic_specs())
    return log
