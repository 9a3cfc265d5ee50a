"""The `EventLog` contract, part one: appending, placement, offsets and reads to the end
(`read`, `read_partition`, `read_topic`), run unchanged against every adapter."""
from __future__ import annotations

import threading
import time

import pytest

from pipelines.eventlog import Message, UnknownTopic, partition_for
from tests.contract.eventlog_contract import EventLogContract, OnEmbedded, OnKafka, derive, values


class ReadContract(EventLogContract):
    def test_appended_records_read_back_as_stored(self):
        log = self.opened()
        topic = self.topic(log)
        appended = log.append(topic, [Message("tenant-a", b"one"), Message("tenant-b", b"two"),
                                      Message("tenant-a", b"three")])
        assert [(r.topic, r.key, r.value) for r in appended] == [
            (topic, "tenant-a", b"one"), (topic, "tenant-b", b"two"), (topic, "tenant-a", b"three")]
        for record in appended:
            assert log.read(topic, record.partition, record.offset, max_records=1) == [record]
        first_a = appended[0]
        assert log.read(topic, first_a.partition, first_a.offset) == [r for r in appended if r.key == "tenant-a"]
        assert self.opened().read(topic, first_a.partition, 0) == log.read(topic, first_a.partition, 0)

    def test_one_key_keeps_its_order_within_its_partition(self):
        log = self.opened()
        topic = self.topic(log, 8)
        messages = [Message(f"tenant-{i % 3}", f"{i % 3}:{i}".encode()) for i in range(60)]
        log.append(topic, messages[:25])
        log.append(topic, messages[25:])
        for key in ("tenant-0", "tenant-1", "tenant-2"):
            stored = [r for r in log.read(topic, partition_for(key, 8), 0, max_records=1000) if r.key == key]
            assert [r.value for r in stored] == [m.value for m in messages if m.key == key]
            assert [r.offset for r in stored] == sorted({r.offset for r in stored})

    def test_a_key_lands_on_partition_for_it_in_every_adapter(self):
        log = self.opened()
        topic = self.topic(log, 8)
        keys = [f"tenant-{i}" for i in range(40)]
        appended = log.append(topic, [Message(k, b"x") for k in keys])
        assert [r.partition for r in appended] == [partition_for(k, 8) for k in keys]
        # Pinned: placement must never change under a deployed log.
        assert [partition_for(k, 8) for k in ("tenant-0", "tenant-1", "acme")] == [1, 7, 6]
        (explicit,) = log.append(topic, [Message("tenant-0", b"y", partition=5)])
        assert explicit.partition == 5

    def test_a_batch_gets_consecutive_offsets(self):
        log = self.opened()
        topic = self.topic(log, 2)
        first = log.append(topic, [Message(f"k{i}", b"%d" % i, partition=1) for i in range(10)])
        second = log.append(topic, [Message(f"k{i}", b"%d" % i, partition=1) for i in range(5)])
        assert [r.offset for r in first + second] == list(range(15))
        assert (log.end_offset(topic, 0), log.end_offset(topic, 1)) == (0, 15)

    def test_end_offset_is_where_the_next_record_goes(self):
        log = self.opened()
        topic = self.topic(log, 1)
        assert log.end_offset(topic, 0) == 0
        log.append(topic, [Message("k", b"a"), Message("k", b"b")])
        assert log.end_offset(topic, 0) == 2
        (record,) = log.append(topic, [Message("k", b"c")])
        assert record.offset == 2 and log.end_offset(topic, 0) == 3
        with pytest.raises(UnknownTopic):
            log.end_offset(self.fresh("missing"), 0)

    def test_read_returns_nothing_at_its_timeout_and_records_that_arrive_during_the_wait(self):
        log, writer = self.opened(), self.opened()
        topic = self.topic(log, 1)
        assert log.read(topic, 0, 0) == []
        started = time.monotonic()
        assert log.read(topic, 0, 0, timeout_s=0.5) == []
        assert 0.45 <= time.monotonic() - started < 5.0
        reading = threading.Event()

        def append_late():
            reading.wait(30)
            writer.append(topic, [Message("k", b"late")])

        appender = threading.Thread(target=append_late)
        appender.start()
        reading.set()
        started = time.monotonic()
        got = log.read(topic, 0, 0, timeout_s=60)
        waited = time.monotonic() - started
        appender.join(30)
        assert values(got) == [b"late"]
        assert waited < 30

    def test_a_read_with_a_wait_returns_a_record_that_is_there_without_waiting(self):
        log, writer = self.opened(), self.opened()
        topic = self.topic(log, 2)
        for n in range(3):  # each partition in turn, as a worker reads prompts
            [record] = writer.append(topic, [Message(f"k{n}", b"%d" % n, partition=n % 2)])
            started = time.monotonic()
            got = log.read(topic, record.partition, record.offset, max_records=1, timeout_s=20)
            assert values(got) == [b"%d" % n] and got[0].offset == record.offset
            assert time.monotonic() - started < 5

    def test_read_partition_reads_from_a_position_to_the_end_as_of_the_call(self):
        log, writer = self.opened(), self.opened()
        topic = self.topic(log, 2)
        stored = writer.append(topic, [Message(f"k{i}", b"%d" % i, partition=1) for i in range(7)])
        (other,) = writer.append(topic, [Message("other", b"elsewhere", partition=0)])
        paged = log.read_partition(topic, 1, from_offset=2, page=3)  # pages that end inside the range
        whole = log.read_partition(topic, 1)
        started = log.read_partition(topic, 1, from_offset=1, page=2)
        assert next(started) == stored[1]
        late = writer.append(topic, [Message("late", b"after the call", partition=1)])
        assert list(paged) == stored[2:], "the end is the one as of the call, not of the iteration"
        assert list(whole) == stored
        assert list(started) == stored[2:]
        assert list(log.read_partition(topic, 1, from_offset=5, page=1)) == stored[5:] + late
        assert list(log.read_partition(topic, 1, from_offset=late[0].offset + 1)) == []
        assert list(log.read_partition(topic, 0)) == [other]

    def test_read_topic_reads_every_named_partition_to_its_end_in_partition_order(self):
        log, writer = self.opened(), self.opened()
        topic = self.topic(log, 3)
        placed = enumerate((2, 0, 2, 1, 2, 0))
        stored = writer.append(topic, [Message(f"k{i}", b"%d" % i, partition=p) for i, p in placed])
        reading = log.read_topic(topic, page=2)
        late = writer.append(topic, [Message("late", b"after the call", partition=p) for p in range(3)])
        in_order = sorted(stored, key=lambda r: (r.partition, r.offset))
        assert list(reading) == in_order
        of = {p: [r for r in in_order + late if r.partition == p] for p in range(3)}
        assert list(log.read_topic(topic, {2: 1, 0: 0})) == of[0] + of[2][1:], "only the named partitions, from there"
        assert list(log.read_topic(topic, {1: 0, 0: 2, 2: 0}, page=1)) == of[0][2:] + of[1] + of[2]
        assert list(log.read_topic(self.topic(log, 2))) == []

    def test_reads_to_the_end_skip_uncommitted_output_and_stop_after_transaction_markers(self):
        log = self.opened()
        inputs, outputs, group = self.topic(log, 1), self.topic(log, 1), self.fresh("group")
        log.append(inputs, [Message("k", b"%d" % i) for i in range(2)])
        crashed = log.consumer(group, [inputs], member_id="worker-1")
        self.crash_after_producing(crashed, derive(outputs, self.poll_until(crashed, 2, "the inputs")))
        restarted = log.consumer(group, [inputs], member_id="worker-1")  # aborts the crashed unit on Kafka
        restarted.commit_with(derive(outputs, self.poll_until(restarted, 2, "redelivery after the crash")))
        committed = [b"out:0", b"out:1"]
        assert [r.value for r in log.read_partition(outputs, 0, page=1)] == committed
        (plain,) = log.append(outputs, [Message("k", b"plain")])
        assert [r.value for r in log.read_partition(outputs, 0)] == committed + [b"plain"]
        assert [r.value for r in log.read_topic(outputs, {0: 0}, page=1)] == committed + [b"plain"]
        assert list(log.read_partition(outputs, 0, from_offset=plain.offset + 1)) == []


class TestEmbeddedReads(OnEmbedded, ReadContract):
    pass


class TestKafkaReads(OnKafka, ReadContract):
    pass
