"""The Kafka commit unit when a node's failover gets in the way: the offsets are in the
transaction before its commit is asked for, and a unit whose commit went unanswered is
settled before any committed position is read again. Without either, admission could
settle a request twice: its settlement committed without the position after the outcome,
or its book rebuilt from a ledger that did not yet show the settlement."""
from __future__ import annotations

import time

import pytest
from kafka import errors as kerr

from pipelines.eventlog import EventLogError, Message, TopicSpec
from pipelines.eventlog import kafka_groups
from pipelines.eventlog.kafka import KafkaEventLog



@pytest.fixture
def log(kafka_test_servers):
    opened = KafkaEventLog(kafka_test_servers(), client_id="ledgerlm-contract", timeout_s=10.0,
                           group_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 500,
                                          "max_poll_interval_ms": 8000})
    yield opened
    opened.close()


def _member_with_input(log, fresh, wait_for, count: int = 3):
    inputs, outputs, group = fresh("unit-in"), fresh("unit-out"), fresh("unit-group")
    log.ensure_topics([TopicSpec(inputs, 1), TopicSpec(outputs, 1)])
    log.append(inputs, [Message("k", b"%d" % i) for i in range(count)])
    member = log.consumer(group, [inputs], member_id="member")
    got: list = []

    def enough():
        got.extend(member.poll(timeout_s=0.5))
        return len(got) >= count

    wait_for(enough, timeout_s=90, what=f"{count} records", every_s=0)
    return member, inputs, outputs, got


def test_the_commit_is_asked_for_only_once_the_offsets_are_in(log, fresh, wait_for, monkeypatch):
    member, inputs, outputs, got = _member_with_input(log, fresh, wait_for)
    asked: list[tuple[str, bool]] = []
    offsets_results = []
    real_step = kafka_groups.run_txn_step

    def watched_step(producer, step, *args, timeout_s):
        asked.append((step, all(result.is_done for result in offsets_results)))
        return real_step(producer, step, *args, timeout_s=timeout_s)

    manager = member._transactional_producer()._transaction_manager  # noqa: SLF001
    real_send = manager.send_offsets_to_transaction

    def watched_send(*args, **kwargs):
        result = real_send(*args, **kwargs)
        offsets_results.append(result)
        return result

    monkeypatch.setattr(manager, "send_offsets_to_transaction", watched_send)
    monkeypatch.setattr(kafka_groups, "run_txn_step", watched_step)
    member.commit_with([(outputs, Message("k", b"out"))])
    assert offsets_results, "the unit sent no offsets"
    assert asked == [("begin_commit", True)], asked
    assert member.committed(inputs, 0) == got[-1].offset + 1
    member.close()


def test_a_unit_left_unanswered_is_settled_before_positions_are_read_again(log, fresh, wait_for, monkeypatch):
    member, inputs, outputs, got = _member_with_input(log, fresh, wait_for)
    real_step = kafka_groups.run_txn_step

    def unanswered(producer, step, *args, timeout_s):
        if step == "begin_commit":  # the broker never answers: the transaction stays open
            raise kerr.KafkaTimeoutError("no answer to the commit (test)")
        return real_step(producer, step, *args, timeout_s=timeout_s)

    monkeypatch.setattr(kafka_groups, "run_txn_step", unanswered)
    with pytest.raises(EventLogError):
        member.commit_with([(outputs, Message("k", b"lost"))])
    monkeypatch.setattr(kafka_groups, "run_txn_step", real_step)

    # The open transaction holds the offsets: a stable read of them would wait for it to
    # time out (a minute) unless it is ended first. Read at once, and agree with the outputs.
    began = time.monotonic()
    member.seek_to_committed()
    assert time.monotonic() - began < 8.0
    assert member.committed(inputs, 0) is None
    assert log.read(outputs, 0, 0) == []

    # The inputs come again, and the next unit commits normally.
    again: list = []
    wait_for(lambda: again.extend(member.poll(timeout_s=0.5)) or len(again) >= len(got), timeout_s=60,
             what="the inputs again", every_s=0)
    assert [r.value for r in again] == [r.value for r in got]
    member.commit_with([(outputs, Message("k", b"done"))])
    assert member.committed(inputs, 0) == got[-1].offset + 1
    assert [r.value for r in log.read(outputs, 0, 0)] == [b"done"]
    member.close()
