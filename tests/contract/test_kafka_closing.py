"""A Kafka log leaves no client running: not when it cannot reach the broker, and not when
closing one of its clients fails. Each leftover client is a thread reconnecting for good."""
from __future__ import annotations

import socket
import threading
import uuid

import pytest

from pipelines.eventlog import EventLogError, Message, TopicSpec
from pipelines.eventlog.kafka import KafkaEventLog
from tests.thread_guard import still_running


def threads_of(client_id: str) -> list[threading.Thread]:
    """The live threads of the clients a log with `client_id` made (kafka-python names them after it)."""
    return [t for t in threading.enumerate() if client_id in t.name]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_log_that_cannot_reach_kafka_leaves_no_client_running():
    client_id = "closing-" + uuid.uuid4().hex[:8]
    with pytest.raises(EventLogError, match="cannot reach Kafka"):
        KafkaEventLog([f"127.0.0.1:{closed_port()}"], client_id=client_id, timeout_s=1.0)
    assert still_running(threads_of(client_id), 10) == []


def test_closing_a_log_closes_every_client_even_when_one_of_them_fails(kafka_test_servers, fresh, wait_for):
    client_id = "closing-" + uuid.uuid4().hex[:8]
    log = KafkaEventLog(kafka_test_servers(), client_id=client_id, timeout_s=30.0)
    topic = fresh("closing")
    log.ensure_topics([TopicSpec(topic, 2)])
    log.append(topic, [Message("k", b"v")])  # the producer
    assert log.end_offsets([(topic, 0), (topic, 1)])  # the reader
    log.tail(topic, {0: 0, 1: 0})  # closed with the log, not here
    member = log.consumer(fresh("group"), [topic], member_id="m1")
    wait_for(lambda: member.poll(timeout_s=0.5) or member.assignment(), timeout_s=60, what="the member to join")
    closing_member = member.close

    def fails():
        raise RuntimeError("the member's broker went away")
    member.close = fails
    made = {t.name for t in threads_of(client_id)}
    assert {f"kafka-io-{client_id}-admin", f"kafka-io-{client_id}-reader", f"kafka-io-{client_id}-tail",
            f"kafka-io-{client_id}-m1", f"{client_id}-network-thread"} <= made, made
    try:
        with pytest.raises(RuntimeError, match="went away"):
            log.close()
        left = threads_of(client_id)
        assert still_running([t for t in left if not t.name.endswith("-m1")], 15) == []
        assert [t.name for t in left if t.is_alive()] == [f"kafka-io-{client_id}-m1"]
    finally:
        closing_member()
    assert still_running(threads_of(client_id), 15) == []
