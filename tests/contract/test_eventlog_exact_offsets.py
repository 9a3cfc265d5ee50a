"""`commit_with(outputs, offsets=...)`: a consumer that reads ahead commits only what it
finished, keeps polling from where it was, and a successor starts at what was committed.
Run against both adapters (the pool worker's fair share depends on it)."""
from __future__ import annotations

import pytest

from pipelines.eventlog import EventLog, Message, TopicSpec
from pipelines.eventlog.embedded import EmbeddedEventLog
from pipelines.eventlog.kafka import KafkaEventLog


def _poll_until(consumer, count: int, wait_for) -> list:
    got: list = []

    def enough():
        got.extend(consumer.poll(timeout_s=0.5))
        return len(got) >= count

    wait_for(enough, timeout_s=90, what=f"{count} records", every_s=0)
    return got


@pytest.fixture(params=["embedded", "kafka"])
def open_log(request, tmp_path, kafka_test_servers):
    opened: list[EventLog] = []

    def make() -> EventLog:
        if request.param == "embedded":
            log = EmbeddedEventLog(tmp_path / "eventlog.db", session_timeout_s=2.0, heartbeat_interval_s=0.2)
        else:
            log = KafkaEventLog(kafka_test_servers(), client_id="ledgerlm-contract", timeout_s=30.0,
                                group_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 500,
                                               "max_poll_interval_ms": 8000})
        opened.append(log)
        return log

    yield make
    for log in reversed(opened):
        log.close()


def test_exact_offsets_commit_a_prefix_and_polling_goes_on(open_log, fresh, wait_for):
    log = open_log()
    inputs, outputs, group = fresh("contract"), fresh("contract"), fresh("group")
    log.ensure_topics([TopicSpec(inputs, 1), TopicSpec(outputs, 1)])
    log.append(inputs, [Message("k", b"%d" % i) for i in range(6)])
    first = log.consumer(group, [inputs], member_id="reader-ahead")
    records = _poll_until(first, 6, wait_for)
    # Finished the first two only: their output and the position after them, atomically.
    first.commit_with([(outputs, Message("k", b"done:0,1"))], offsets={(inputs, 0): records[2].offset})
    assert first.committed(inputs, 0) == records[2].offset
    log.append(inputs, [Message("k", b"6")])
    assert [r.value for r in _poll_until(first, 1, wait_for)] == [b"6"], "polling goes on past what was read"
    first.close()

    successor = log.consumer(group, [inputs], member_id="successor")
    again = _poll_until(successor, 5, wait_for)
    assert [r.value for r in again] == [b"2", b"3", b"4", b"5", b"6"]
    successor.commit_with([])
    assert successor.committed(inputs, 0) == again[-1].offset + 1
    assert [r.value for r in log.read(outputs, 0, 0)] == [b"done:0,1"]
