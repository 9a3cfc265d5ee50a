"""Deletes, at the end of a test session, the Kafka topics the session created.

Every platform and contract test makes topics under a fresh namespace, and the broker
keeps them: a few hundred partitions per run, which after a few dozen runs slow the
broker's start past `infra/kafka.sh`'s bound. Topics are recorded as this process asks
for them (`KafkaEventLog.ensure_topics`), so another session's topics on the same broker
are never touched, nor are the un-namespaced `ledgerlm.*` ones. A failed cleanup is a
warning, not a failed run: it cannot change what the tests found.
"""
from __future__ import annotations

import os
import warnings
from typing import Callable

import pytest

_created: set[str] = set()


@pytest.fixture(scope="session", autouse=True)
def _delete_session_topics():
    from pipelines.eventlog.kafka import KafkaEventLog

    original = KafkaEventLog.ensure_topics

    def ensure_topics(self, specs):
        specs = list(specs)
        _created.update(s.name for s in specs if not s.name.startswith("ledgerlm."))
        return original(self, specs)

    KafkaEventLog.ensure_topics = ensure_topics
    try:
        yield
    finally:
        KafkaEventLog.ensure_topics = original
        url = os.environ.get("LEDGERLM_TEST_KAFKA", "")
        if _created and url.startswith("kafka://"):
            _delete(url[len("kafka://"):].split(","), _created.__contains__)


def _delete(servers: list[str], chosen: Callable[[str], bool]) -> int:
    """Deletes the topics on the broker that `chosen` picks; returns how many it picked."""
    from kafka.admin import KafkaAdminClient

    try:
        admin = KafkaAdminClient(bootstrap_servers=servers, client_id="ledgerlm-test-cleanup",
                                 request_timeout_ms=30_000)
    except Exception as exc:  # the broker is gone already: nothing to clean
        warnings.warn(f"could not reach Kafka to delete test topics: {exc!r}")
        return 0
    doomed: list[str] = []
    try:
        doomed = sorted(n for n in admin.list_topics() if chosen(n))
        for i in range(0, len(doomed), 100):
            admin.delete_topics(doomed[i:i + 100], timeout_ms=30_000)
    except Exception as exc:
        warnings.warn(f"deleting Kafka topics failed: {exc!r}")
    finally:
        admin.close()
    return len(doomed)


def delete_prefixed(url: str, prefix: str) -> int:
    """Deletes every topic whose name starts with `prefix` on the Kafka at `url`
    (kafka://host:port); returns how many there were. The benchmarks call it before and
    after a run, so the broker holds the same topics for every run, whatever was left
    by one that was interrupted. Benchmarks run one at a time: a concurrent one would
    lose its topics."""
    return _delete(url[len("kafka://"):].split(","), lambda name: name.startswith(prefix))


def forget(prefix: str) -> None:
    """Drops the topics under `prefix` from those to delete at the end of the session: they
    were made on a cluster of a test's own, gone with it, and the shared broker has none."""
    _created.difference_update({name for name in _created if name.startswith(prefix)})
