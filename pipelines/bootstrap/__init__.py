"""The one place that turns settings into adapters. Entrypoints (the API, the workers, the
CLIs) and the test fixtures build a `Bootstrap` from their `Settings` and ask it for what
they need; each adapter is chosen by its URL's scheme, the engine by the setting naming
its factory. Nothing connects to anything at import time, nor when a `Bootstrap` is made:
each method opens a new handle, which the caller owns and closes."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from models import topics
from models.settings import Settings
from pipelines.eventlog import EventLog, TopicSpec, open_event_log
from pipelines.eventlog.namespaced import NamespacedEventLog
from pipelines.kafka_security import kafka_security

if TYPE_CHECKING:  # imported where used: a process that needs no database never loads SQLAlchemy
    from sqlalchemy import Engine

    from pipelines.admin.commands import RegistryView
    from pipelines.batch.queue import CeleryChunkQueue
    from pipelines.admission.capacity import Floors
    from pipelines.objectstore import ObjectStore


def topic_specs() -> list[TopicSpec]:
    return [TopicSpec(t.name, t.partitions, t.retention_ms) for t in topics.ALL]


@dataclass(frozen=True)
class Bootstrap:
    settings: Settings

    def event_log(self, *, create_topics: bool = True, timeout_s: float | None = None) -> EventLog:
        """A new handle on the log `event_log_url` names (kafka://, sqlite:///), inside
        `event_log_namespace`. With `create_topics`, missing topics are made first.
        `timeout_s`: the longest one call to Kafka may wait (the API's is short, so a
        request meets an outage as a prompt 503); the adapter's default otherwise."""
        settings = self.settings
        if settings.event_log_url.startswith("sqlite:///"):
            settings.ensure_home()
        options: dict = {}
        session_s = settings.group_session_timeout_s  # None: the log's own
        if settings.event_log_url.startswith("kafka://"):
            options["security"] = kafka_security(settings)
            if session_s is not None:
                options["group_options"] = {"session_timeout_ms": int(session_s * 1000),
                                            "heartbeat_interval_ms": int(min(1.0, session_s / 6) * 1000)}
            if timeout_s:
                options["timeout_s"] = timeout_s
            if settings.kafka_replication_factor:
                options["replication_factor"] = settings.kafka_replication_factor
        elif settings.event_log_url.startswith("sqlite:///") and session_s is not None:
            options.update(session_timeout_s=session_s, heartbeat_interval_s=min(1.0, session_s / 6))
        log = open_event_log(settings.event_log_url, **options)
        if settings.event_log_namespace:
            log = NamespacedEventLog(log, settings.event_log_namespace)
        if create_topics:
            try:
                log.ensure_topics(topic_specs())
            except BaseException:
                log.close()  # the caller never gets it to close
                raise
        return log

    def registry_view(self, log: EventLog) -> RegistryView:
        """Tenants, keys, limits and models, as folded from the admin topic of `log`."""
        from pipelines.admin.commands import RegistryView

        return RegistryView(log)

    def projection_db(self, url: str | None = None, **options) -> Engine:
        """A SQLAlchemy engine on the projection database (`database_url`, or `url` where a
        verb names another one); the caller disposes of it."""
        from pipelines.projections.sql import open_projection_db

        return open_projection_db(url or self.settings.database_url, **options)

    def object_store(self) -> ObjectStore:
        """The store `object_store_url` names (s3://, file://, memory://)."""
        from pipelines.objectstore import open_object_store

        settings = self.settings
        return open_object_store(settings.object_store_url, endpoint_url=settings.s3_endpoint_url,
                                 key=settings.s3_key, secret=settings.s3_secret)

    def celery_config(self) -> dict:
        """The Celery configuration of the batch queue, the same for producer and workers."""
        from pipelines.batch.queue import celery_config

        settings = self.settings
        return celery_config(settings.celery_broker_url, settings.batch_queue,
                             chunk_time_limit_s=settings.batch_chunk_time_limit_s)

    def chunk_queue(self) -> CeleryChunkQueue:
        """Where the batch dispatcher hands chunks to the batch pool (`celery_broker_url`)."""
        from pipelines.batch.queue import CeleryChunkQueue

        settings = self.settings
        return CeleryChunkQueue(settings.celery_broker_url, settings.batch_queue,
                                chunk_time_limit_s=settings.batch_chunk_time_limit_s)

    def service_floors(self) -> Floors:
        """The service admission assumes before it measures any (`admission_floor_*`)."""
        from pipelines.admission.capacity import Floors

        return Floors.from_settings(self.settings)

    def engine_factory(self) -> Callable[[Settings], Any]:
        """The callable `engine_factory` names ("module:attribute.path"), imported now. The
        default builds vLLM; `pipelines` never imports the workers, so it is named, not
        imported here."""
        return resolve(self.settings.engine_factory)

    def engine(self, **overrides) -> Any:
        """A new, unstarted inference engine from the settings (with `overrides` applied)."""
        settings = self.settings.model_copy(update=overrides) if overrides else self.settings
        return self.engine_factory()(settings)


def resolve(name: str) -> Any:
    """'package.module:Class.method' -> that object; a clear ValueError when the name is not
    one, a TypeError when what it names cannot be called."""
    module_name, colon, path = name.partition(":")
    if not colon or not module_name or not path:
        raise ValueError(f"not a factory name: {name!r} (expected 'package.module:callable')")
    target: Any = importlib.import_module(module_name)
    for part in path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"{name!r}: {module_name} has no {path}") from None
    if not callable(target):
        raise TypeError(f"{name!r} is not callable")
    return target


def open_log(settings: Settings, *, create_topics: bool = True) -> EventLog:
    """`Bootstrap(settings).event_log(...)`, for callers that need only the log."""
    return Bootstrap(settings).event_log(create_topics=create_topics)
