"""The `EventLog` contract's frame: the base every contract suite extends, and how each
adapter is opened on its backing store and how a member dies mid-commit there.

Every test makes its own topics and groups (uuid-suffixed), so tests never see each
other's records even on a shared broker. Waits are conditions with deadlines; group
joins and session expiry get generous ones (a loaded two-core machine is slow).
"""
from __future__ import annotations

import pytest

from pipelines.eventlog import EventLog, GroupConsumer, Message, Record, TopicSpec
from pipelines.eventlog.embedded import EmbeddedEventLog
from pipelines.eventlog.embedded_store import insert_records
from pipelines.eventlog.kafka import KafkaEventLog
from pipelines.eventlog.kafka_clients import close_all

GROUP_WAIT_S = 90.0


def values(records: list[Record]) -> list[bytes]:
    return sorted(r.value for r in records)


def derive(topic: str, records: list[Record]) -> list[tuple[str, Message]]:
    """What a processor would write for `records`: one output per input, same key."""
    return [(topic, Message(r.key, b"out:" + r.value)) for r in records]


class EventLogContract:
    """Subclasses say how to open a log on their backing store and how a member dies mid-commit."""

    def open_log(self) -> EventLog:
        raise NotImplementedError

    def crash_after_producing(self, consumer: GroupConsumer, outputs: list[tuple[str, Message]]) -> None:
        """Writes `outputs` inside the consumer's unit of work, then dies before committing it."""
        raise NotImplementedError

    @pytest.fixture(autouse=True)
    def _helpers(self, fresh, wait_for):
        self.fresh, self.wait_for = fresh, wait_for
        self._opened: list[EventLog] = []
        yield
        close_all(log.close for log in reversed(self._opened))

    def opened(self) -> EventLog:
        """A new log object on the same backing store, closed after the test (like another process)."""
        log = self.open_log()
        self._opened.append(log)
        return log

    def topic(self, log: EventLog, partitions: int = 4, **options) -> str:
        name = self.fresh("contract")
        log.ensure_topics([TopicSpec(name, partitions, **options)])
        return name

    def read_all(self, log: EventLog, topic: str) -> list[Record]:
        return list(log.read_topic(topic))

    def poll_until(self, consumer: GroupConsumer, count: int, what: str) -> list[Record]:
        got: list[Record] = []

        def enough():
            got.extend(consumer.poll(timeout_s=0.5))
            return len(got) >= count

        self.wait_for(enough, timeout_s=GROUP_WAIT_S, what=what, every_s=0)
        return got


class OnEmbedded:
    """Mixed in before a contract: the embedded SQLite log."""

    @pytest.fixture(autouse=True)
    def _store(self, tmp_path):
        self.path = tmp_path / "eventlog.db"

    def open_log(self) -> EventLog:
        return EmbeddedEventLog(self.path, session_timeout_s=2.0, heartbeat_interval_s=0.2)

    def open_slow_session_log(self) -> EventLog:
        """Members dropped for silence only after a minute: what `evict` is faster than."""
        return EmbeddedEventLog(self.path, session_timeout_s=60.0, heartbeat_interval_s=0.2)

    def crash_after_producing(self, consumer, outputs):
        conn = consumer._conn
        conn.execute("BEGIN IMMEDIATE")
        insert_records(conn, outputs)
        conn.close()  # the process dies here: SQLite rolls back what was never committed
        consumer._closed = True


class OnKafka:
    """Mixed in before a contract: the test broker."""

    @pytest.fixture(autouse=True)
    def _broker(self, kafka_test_servers):
        self.servers = kafka_test_servers  # called in the test body: no broker is a failure, not an error

    def open_log(self) -> EventLog:
        # Short sessions so a stalled member is dropped in seconds; the broker's minimum is 6 s.
        return KafkaEventLog(self.servers(), client_id="ledgerlm-contract", timeout_s=30.0,
                             group_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 500,
                                            "max_poll_interval_ms": 8000})

    def open_slow_session_log(self) -> EventLog:
        """Members dropped for silence only after 45 s (kafka-python's default session)."""
        return KafkaEventLog(self.servers(), client_id="ledgerlm-contract", timeout_s=30.0,
                             group_options={"session_timeout_ms": 45_000, "heartbeat_interval_ms": 500,
                                            "max_poll_interval_ms": 60_000})

    def crash_after_producing(self, consumer, outputs):
        producer = consumer._transactional_producer()
        producer.begin_transaction()
        for topic, message in outputs:
            producer.send(topic, key=message.key.encode(), value=message.value,
                          partition=consumer._log.place(topic, message))
        producer.flush(timeout=30)
        producer.close(timeout=0)  # dies without commit or abort: the transaction stays open
        consumer._producer = None
        consumer.close()
