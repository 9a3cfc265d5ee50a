"""Batched position look-ups: `EventLog.end_offsets` and `GroupConsumer.committed_offsets`
answer for many partitions at once exactly what `end_offset` and `committed` answer for
each (a pool worker looks up dozens of work partitions at every assignment). Run against
both adapters, bare and under a namespace (as the platform opens Kafka)."""
from __future__ import annotations

import pytest

from pipelines.eventlog import EventLog, Message, TopicSpec
from pipelines.eventlog.embedded import EmbeddedEventLog
from pipelines.eventlog.kafka import KafkaEventLog
from pipelines.eventlog.namespaced import NamespacedEventLog

GROUP_WAIT_S = 90.0


@pytest.fixture(params=["embedded", "kafka", "kafka-namespaced"])
def open_log(request, tmp_path, kafka_test_servers, fresh):
    opened: list[EventLog] = []
    namespace = fresh("ns")

    def make() -> EventLog:
        if request.param == "embedded":
            log: EventLog = EmbeddedEventLog(tmp_path / "eventlog.db", session_timeout_s=2.0,
                                             heartbeat_interval_s=0.2)
        else:
            log = KafkaEventLog(kafka_test_servers(), client_id="ledgerlm-contract", timeout_s=30.0,
                                group_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 500,
                                               "max_poll_interval_ms": 8000})
            if request.param == "kafka-namespaced":
                log = NamespacedEventLog(log, namespace)
        opened.append(log)
        return log

    yield make
    for log in reversed(opened):
        log.close()


def test_end_offsets_of_many_partitions_match_each_partitions_end(open_log, fresh):
    log = open_log()
    first, second = fresh("contract"), fresh("contract")
    log.ensure_topics([TopicSpec(first, 4), TopicSpec(second, 2)])
    log.append(first, [Message(f"k{i}", b"v", partition=i % 4) for i in range(7)])
    log.append(second, [Message("k", b"v", partition=1)] * 3)
    wanted = [(first, p) for p in range(4)] + [(second, p) for p in range(2)]
    ends = log.end_offsets(wanted)
    assert ends == {(first, 0): 2, (first, 1): 2, (first, 2): 2, (first, 3): 1, (second, 0): 0, (second, 1): 3}
    assert ends == {tp: log.end_offset(*tp) for tp in wanted}
    assert log.end_offsets([]) == {}
    # Another handle (another process) sees the same, having looked up one of the topics
    # before (on Kafka its reader then knows the first topic's partitions, not the second's).
    other = open_log()
    assert other.end_offset(first, 0) == 2
    assert other.end_offsets(wanted) == ends


def test_committed_offsets_of_many_partitions_match_each_partitions_commit(open_log, fresh, wait_for):
    log = open_log()
    inputs, outputs, group = fresh("contract"), fresh("contract"), fresh("group")
    log.ensure_topics([TopicSpec(inputs, 3), TopicSpec(outputs, 1)])
    log.append(inputs, [Message("k", b"%d" % i, partition=i % 2) for i in range(6)])
    consumer = log.consumer(group, [inputs], member_id="batched")
    got: list = []

    def polled_all() -> bool:
        got.extend(consumer.poll(timeout_s=0.5))
        return len(got) >= 6

    wait_for(polled_all, timeout_s=GROUP_WAIT_S, what="six records", every_s=0)
    wanted = [(inputs, p) for p in range(3)]
    assert consumer.committed_offsets(wanted) == {tp: None for tp in wanted}, "nothing committed yet"
    # Partition 0 committed part way, partition 1 to its end, partition 2 never.
    consumer.commit_with([(outputs, Message("k", b"done"))], offsets={(inputs, 0): 1, (inputs, 1): 3})
    found = consumer.committed_offsets(wanted)
    assert found == {(inputs, 0): 1, (inputs, 1): 3, (inputs, 2): None}
    assert found == {tp: consumer.committed(*tp) for tp in wanted}
    assert consumer.committed_offsets([]) == {}
    # The commit positions polling restarts from as well (after a failed unit of work).
    consumer.seek_to_committed()
    again: list = []

    def polled_again() -> bool:
        again.extend(consumer.poll(timeout_s=0.5))
        return len(again) >= 2

    wait_for(polled_again, timeout_s=GROUP_WAIT_S, what="the uncommitted records again", every_s=0)
    assert sorted((r.partition, r.offset) for r in again) == [(0, 1), (0, 2)]
    consumer.close()
