"""`EventLog.tail`: the adapters' own tails (`EmbeddedTail`, `KafkaTail`) and the
generic `Tail` behave alike: from the given offsets, only the chosen partitions, each
partition in order, what other handles append, nothing twice, a backlog in bounded polls."""
from __future__ import annotations

import time
import uuid

import pytest

from pipelines.eventlog import EventLog, Message, TopicSpec
from pipelines.eventlog.base import Tail
from pipelines.eventlog.embedded import EmbeddedEventLog
from pipelines.eventlog.kafka import KafkaEventLog
from tests.helpers import wait_until


def drain(tail: Tail, want: int, timeout_s: float = 30.0, max_records: int = 500) -> list:
    """Polls until at least `want` records came, in polls of at most `max_records`."""
    got: list = []

    def enough() -> bool:
        batch = tail.poll(max_records=max_records, timeout_s=0.2)
        assert len(batch) <= max_records
        got.extend(batch)
        return len(got) >= want
    wait_until(enough, timeout_s, what=f"{want} records from the tail", every_s=0)
    return got


class TailContract:
    def open_log(self) -> EventLog:
        raise NotImplementedError

    @pytest.fixture(params=["adapter", "generic"])
    def make_tail(self, request):
        def make(log: EventLog, topic: str, offsets: dict[int, int]) -> Tail:
            return log.tail(topic, offsets) if request.param == "adapter" else Tail(log, topic, offsets)

        return make

    def test_follows_chosen_partitions_from_offsets_in_order(self, make_tail):
        topic = f"tail-{uuid.uuid4().hex[:10]}"
        writer, reader = self.open_log(), self.open_log()
        try:
            writer.ensure_topics([TopicSpec(topic, 3)])
            writer.append(topic, [Message("k", f"old-{p}".encode(), partition=p) for p in range(3)])
            tail = make_tail(reader, topic, {0: 1, 1: 0})
            writer.append(topic, [Message("k", f"{p}-{i}".encode(), partition=p) for i in range(5) for p in range(3)])
            got = drain(tail, 11)
            assert tail.poll(timeout_s=0.3) == []
            tail.close()
        finally:
            writer.close()
            reader.close()
        assert {r.partition for r in got} == {0, 1}
        by_partition = {p: [r.value.decode() for r in got if r.partition == p] for p in (0, 1)}
        assert by_partition[0] == [f"0-{i}" for i in range(5)]
        assert by_partition[1] == ["old-1"] + [f"1-{i}" for i in range(5)]
        assert all(r.topic == topic for r in got)

    def test_a_backlog_comes_in_bounded_polls_and_reaches_every_partition(self, make_tail):
        topic = f"tail-{uuid.uuid4().hex[:10]}"
        log = self.open_log()
        try:
            log.ensure_topics([TopicSpec(topic, 2)])
            log.append(topic, [Message("k", b"busy", partition=0) for _ in range(300)])
            log.append(topic, [Message("k", b"quiet", partition=1)])
            tail = make_tail(log, topic, {0: 0, 1: 0})
            got = drain(tail, 301, max_records=50)
            assert tail.poll(max_records=50, timeout_s=0.2) == []
            tail.close()
        finally:
            log.close()
        assert len(got) == 301 and sum(r.value == b"quiet" for r in got) == 1


    def test_positioning_ends_seek_and_time(self, make_tail):
        topic = f"tail-{uuid.uuid4().hex[:10]}"
        log = self.open_log()
        try:
            log.ensure_topics([TopicSpec(topic, 2)])
            early = log.append(topic, [Message("k", f"e{i}".encode(), partition=0) for i in range(4)])
            time.sleep(0.05)  # record timestamps are the clock's: two stamps apart, on purpose
            late = log.append(topic, [Message("k", f"l{i}".encode(), partition=0) for i in range(3)])
            tail = make_tail(log, topic, {0: 0, 1: 0})
            assert tail.end_offsets() == {0: late[-1].offset + 1, 1: 0}
            assert tail.low_offsets() == {0: 0, 1: 0}
            tail.seek_to_time(late[0].timestamp_ms)
            assert tail.offsets[0] == late[0].offset and tail.offsets[1] == 0
            assert [r.value for r in drain(tail, 3)] == [b"l0", b"l1", b"l2"]
            tail.seek(0, early[1].offset)
            assert [r.value for r in drain(tail, 6)][:2] == [b"e1", b"e2"]
            assert tail.offsets[0] == tail.end_offsets()[0], "caught up: offsets reach the ends"
            tail.close()
        finally:
            log.close()


    def test_read_to_reads_until_the_ends_and_gives_up_at_its_timeout(self, make_tail):
        topic = f"tail-{uuid.uuid4().hex[:10]}"
        writer, reader = self.open_log(), self.open_log()
        try:
            writer.ensure_topics([TopicSpec(topic, 3)])
            writer.append(topic, [Message("k", f"{p}-{i}".encode(), partition=p) for i in range(4) for p in range(3)])
            tail = make_tail(reader, topic, {0: 1, 1: 0})
            got = list(tail.read_to(timeout_s=30, max_records=2))
            assert tail.offsets == {0: 4, 1: 4}
            assert list(tail.read_to(timeout_s=5)) == [], "caught up: nothing more to read"
            (late,) = writer.append(topic, [Message("k", b"late", partition=1)])
            assert [r.value for r in tail.read_to({1: late.offset + 1}, timeout_s=30)] == [b"late"]
            with pytest.raises(TimeoutError):
                list(tail.read_to({1: late.offset + 2}, timeout_s=0.5))  # a record that never comes
            tail.close()
        finally:
            writer.close()
            reader.close()
        by_partition = {p: [r.value.decode() for r in got if r.partition == p] for p in (0, 1, 2)}
        assert by_partition == {0: ["0-1", "0-2", "0-3"], 1: [f"1-{i}" for i in range(4)], 2: []}

    def test_an_adapters_tail_catches_up_past_transactional_writes(self):
        source, topic = f"src-{uuid.uuid4().hex[:10]}", f"tail-{uuid.uuid4().hex[:10]}"
        log = self.open_log()
        try:
            log.ensure_topics([TopicSpec(source, 1), TopicSpec(topic, 1)])
            log.append(source, [Message("k", b"in")])
            consumer = log.consumer(f"g-{uuid.uuid4().hex[:8]}", [source])
            wait_until(lambda: consumer.poll(timeout_s=0.5), 60, what="the group to deliver", every_s=0)
            consumer.commit_with([(topic, Message("k", b"out"))])  # a transaction on Kafka: a marker follows
            consumer.close()
            tail = log.tail(topic, {0: 0})
            assert [r.value for r in drain(tail, 1)] == [b"out"]
            assert list(tail.read_to(timeout_s=10)) == []
            assert tail.offsets[0] == tail.end_offsets()[0]
            tail.close()
        finally:
            log.close()


class TestEmbeddedTail(TailContract):
    @pytest.fixture(autouse=True)
    def _store(self, tmp_path):
        self.path = tmp_path / "eventlog.db"

    def open_log(self) -> EventLog:
        return EmbeddedEventLog(self.path)


class TestKafkaTail(TailContract):
    @pytest.fixture(autouse=True)
    def _broker(self, kafka_test_servers):
        self.servers = kafka_test_servers

    def open_log(self) -> EventLog:
        return KafkaEventLog(self.servers(), client_id="ledgerlm-tail-contract", timeout_s=30.0)
