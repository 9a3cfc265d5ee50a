"""The `EventLog` contract: one suite, run unchanged against every adapter.

Every test makes its own topics and groups (uuid-suffixed), so tests never see each
other's records even on a shared broker. Waits are conditions with deadlines; group
joins and session expiry get generous ones (a loaded two-core machine is slow).
"""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from pipelines.eventlog import (
    EventLog, Fenced, GroupConsumer, Message, Record, TopicSpec, UnknownTopic, open_event_log, partition_for,
)
from pipelines.eventlog.embedded import EmbeddedEventLog
from pipelines.eventlog.embedded_store import insert_records
from pipelines.eventlog.kafka import KafkaEventLog

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
        for log in reversed(self._opened):
            log.close()

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

    def test_committed_positions_survive_reopening_the_log(self):
        log = self.opened()
        topic, group = self.topic(log, 2), self.fresh("group")
        log.append(topic, [Message(f"tenant-{i}", b"%d" % i) for i in range(6)])
        consumer = log.consumer(group, [topic])
        self.poll_until(consumer, 6, "the first member to read all six records")
        consumer.commit()
        ends = {p: log.end_offset(topic, p) for p in range(2)}
        assert {p: consumer.committed(topic, p) for p in range(2)} == ends
        log.close()
        self._opened.remove(log)

        reopened = self.opened()
        again = reopened.consumer(group, [topic])
        assert {p: again.committed(topic, p) for p in range(2)} == ends
        reopened.append(topic, [Message("tenant-9", b"after")])
        assert values(self.poll_until(again, 1, "the record appended after reopening")) == [b"after"]
        assert again.poll(timeout_s=1.0) == []

    def test_closing_without_commit_redelivers_to_the_next_member(self):
        log = self.opened()
        topic, group = self.topic(log, 2), self.fresh("group")
        log.append(topic, [Message(f"tenant-{i}", b"%d" % i) for i in range(4)])
        first = log.consumer(group, [topic])
        got = self.poll_until(first, 4, "the first member's records")
        first.close()
        second = log.consumer(group, [topic])
        assert values(self.poll_until(second, 4, "redelivery to the next member")) == values(got)

    def test_crash_between_produce_and_commit_redelivers_without_duplicate_output(self):
        log = self.opened()
        inputs, outputs, group = self.topic(log, 2), self.topic(log, 2), self.fresh("group")
        log.append(inputs, [Message(f"tenant-{i}", b"%d" % i) for i in range(4)])
        crashed = log.consumer(group, [inputs], member_id="worker-1")
        records = self.poll_until(crashed, 4, "records before the crash")
        self.crash_after_producing(crashed, derive(outputs, records))

        restarted = log.consumer(group, [inputs], member_id="worker-1")
        again = self.poll_until(restarted, 4, "redelivery after the crash")
        assert values(again) == values(records)
        restarted.commit_with(derive(outputs, again))
        assert values(self.read_all(log, outputs)) == values([r for _, r in derive(outputs, records)])
        assert restarted.poll(timeout_s=1.0) == []

    def test_on_committed_runs_once_per_committed_unit_and_what_it_appends_comes_after(self):
        log = self.opened()
        inputs, outputs, group = self.topic(log, 2), self.topic(log, 1), self.fresh("group")
        log.append(inputs, [Message("k", b"1")])
        consumer = log.consumer(group, [inputs])
        records = self.poll_until(consumer, 1, "the record")
        calls: list[str] = []
        with pytest.raises(UnknownTopic):
            consumer.commit_with(derive(outputs, records) + [(self.fresh("missing"), Message("k", b"lost"))],
                                 on_committed=lambda: calls.append("failed"))
        assert calls == [], "a unit that was not committed reported that it was"

        def committed() -> None:  # as the worker does: later output goes out as soon as the unit commits
            calls.append("committed")
            log.append(outputs, [Message("k", b"after")])

        consumer.seek_to_committed()
        consumer.commit_with(derive(outputs, self.poll_until(consumer, 1, "the record again")), on_committed=committed)
        assert calls == ["committed"]
        assert [r.value for r in self.read_all(log, outputs)] == [b"out:1", b"after"]  # one partition: in order

    def test_a_failed_commit_with_leaves_no_output_and_no_position(self):
        log = self.opened()
        inputs, outputs, group = self.topic(log, 2), self.topic(log, 2), self.fresh("group")
        log.append(inputs, [Message(f"tenant-{i}", b"%d" % i) for i in range(3)])
        consumer = log.consumer(group, [inputs])
        records = self.poll_until(consumer, 3, "the inputs")
        doomed = derive(outputs, records) + [(self.fresh("missing"), Message("k", b"lost"))]
        with pytest.raises(UnknownTopic):
            consumer.commit_with(doomed)
        assert self.read_all(log, outputs) == []
        assert [consumer.committed(inputs, p) for p in range(2)] == [None, None]

        consumer.seek_to_committed()
        again = self.poll_until(consumer, 3, "the inputs again after the failed unit of work")
        consumer.commit_with(derive(outputs, again))
        assert values(self.read_all(log, outputs)) == values([m for _, m in derive(outputs, records)])

    def test_a_member_that_lost_its_partitions_is_fenced_and_writes_nothing(self):
        log = self.opened()
        inputs, outputs, group = self.topic(log, 2), self.topic(log, 2), self.fresh("group")
        log.append(inputs, [Message(f"tenant-{i}", b"%d" % i) for i in range(4)])
        stalled = log.consumer(group, [inputs])
        records = self.poll_until(stalled, 4, "the first member's records")
        taker = log.consumer(group, [inputs])
        taken: list[Record] = []

        def took_everything():
            batch = taker.poll(timeout_s=0.5)
            if batch:
                try:
                    taker.commit_with(derive(outputs, batch))
                    taken.extend(batch)
                except Fenced:  # the stalled member dropped out meanwhile: a new split
                    taker.seek_to_committed()
            return taker.assignment() == {(inputs, 0), (inputs, 1)} and len(taken) >= 4

        self.wait_for(took_everything, timeout_s=GROUP_WAIT_S, what="the stalled member's partitions to move")
        with pytest.raises(Fenced):
            stalled.commit_with(derive(outputs, records))
        assert values(taken) == values(records)
        assert values(self.read_all(log, outputs)) == values([m for _, m in derive(outputs, records)])

    def test_two_members_split_the_partitions_and_consume_every_record_once(self):
        log = self.opened()
        inputs, outputs, group = self.topic(log, 4), self.topic(log, 4), self.fresh("group")
        members = [log.consumer(group, [inputs]) for _ in range(2)]
        assignments: dict[int, set] = {0: set(), 1: set()}
        consumed: dict[int, list[Record]] = {0: [], 1: []}
        failures: list[BaseException] = []
        stop = threading.Event()

        def work(i: int, member: GroupConsumer) -> None:
            try:
                while not stop.is_set():
                    records = member.poll(timeout_s=0.2)
                    assignments[i] = member.assignment()
                    if records:
                        try:
                            member.commit_with(derive(outputs, records))
                            consumed[i] += records
                        except Fenced:
                            member.seek_to_committed()
            except BaseException as exc:  # surfaced by the main thread
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(i, m)) for i, m in enumerate(members)]
        for t in threads:
            t.start()
        try:
            everything = {(inputs, p) for p in range(4)}
            self.wait_for(lambda: failures or (assignments[0] and assignments[1]
                                               and not assignments[0] & assignments[1]
                                               and assignments[0] | assignments[1] == everything),
                          timeout_s=GROUP_WAIT_S, what="the two members to split the partitions")
            log.append(inputs, [Message(f"tenant-{i}", b"%d" % i) for i in range(200)])
            self.wait_for(lambda: failures or len(consumed[0]) + len(consumed[1]) >= 200,
                          timeout_s=GROUP_WAIT_S, what="all 200 records to be consumed")
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert not failures, failures
        assert consumed[0] and consumed[1]
        assert values(consumed[0] + consumed[1]) == sorted(b"%d" % i for i in range(200))
        partitions_of = [{(r.topic, r.partition) for r in consumed[i]} for i in range(2)]
        assert not partitions_of[0] & partitions_of[1]
        assert values(self.read_all(log, outputs)) == sorted(b"out:%d" % i for i in range(200))


class TestEmbeddedEventLog(EventLogContract):
    @pytest.fixture(autouse=True)
    def _store(self, tmp_path):
        self.path = tmp_path / "eventlog.db"

    def open_log(self) -> EventLog:
        return EmbeddedEventLog(self.path, session_timeout_s=2.0, heartbeat_interval_s=0.2)

    def crash_after_producing(self, consumer, outputs):
        conn = consumer._conn
        conn.execute("BEGIN IMMEDIATE")
        insert_records(conn, outputs)
        conn.close()  # the process dies here: SQLite rolls back what was never committed
        consumer._closed = True

    def test_retention_drops_old_records_and_reads_start_at_the_first_kept(self):
        log = self.opened()
        topic, durable, group = self.topic(log, 1, retention_ms=60_000), self.topic(log, 1), self.fresh("group")
        old = log.append(topic, [Message("k", b"old-%d" % i) for i in range(3)])
        born = old[-1].timestamp_ms
        self.wait_for(lambda: time.time_ns() // 1_000_000 > born, timeout_s=5, what="the clock to move on")
        young = log.append(topic, [Message("k", b"young")])
        log.append(durable, [Message("k", b"kept")])
        consumer = log.consumer(group, [topic])
        assert log.enforce_retention(now=born + 60_000) == 0
        assert log.enforce_retention(now=born + 60_001) == 3
        assert (log.low_offset(topic, 0), log.end_offset(topic, 0)) == (3, 4)
        assert log.read(topic, 0, 0) == young
        assert values(self.poll_until(consumer, 1, "the retained record")) == [b"young"]
        log.enforce_retention(now=born + 10**12)
        assert values(log.read(durable, 0, 0)) == [b"kept"]
        assert (log.low_offset(topic, 0), log.end_offset(topic, 0), log.read(topic, 0, 0)) == (4, 4, [])

    def test_a_topic_is_looked_up_once_per_connection_and_a_missing_one_is_found_once_made(self):
        log, other = self.opened(), self.opened()
        topic = self.topic(log, 3)
        lookups = []
        log._conn.set_trace_callback(lambda sql: lookups.append(sql) if "FROM topics" in sql else None)
        for i in range(5):
            log.append(topic, [Message(f"k{i}", b"x")])
            log.read(topic, i % 3, 0)
            assert log.partitions(topic) == 3
        assert len(lookups) == 1, lookups
        late = self.fresh("late")
        with pytest.raises(UnknownTopic):
            log.partitions(late)
        other.ensure_topics([TopicSpec(late, 2, None)])  # made by another connection meanwhile
        assert log.partitions(late) == 2, "a miss is not remembered"

    def test_processes_append_to_one_file_without_losing_an_offset(self):
        log = self.opened()
        topic = self.topic(log, 1)
        script = textwrap.dedent(f"""
            import sys
            from pipelines.eventlog import Message
            from pipelines.eventlog.embedded import EmbeddedEventLog
            log = EmbeddedEventLog({str(self.path)!r})
            for batch in range(20):
                log.append({topic!r}, [Message(sys.argv[1], b"%s:%d" % (sys.argv[1].encode(), batch * 10 + i))
                                       for i in range(10)])
            log.close()
        """)
        procs = [subprocess.Popen([sys.executable, "-c", script, f"p{n}"]) for n in range(3)]
        assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
        stored = self.read_all(log, topic)
        assert [r.offset for r in stored] == list(range(600))
        for n in range(3):
            mine = [int(r.value.split(b":")[1]) for r in stored if r.key == f"p{n}"]
            assert mine == list(range(200))

    def test_a_restarted_member_fences_its_old_instance(self):
        log = self.opened()
        inputs, outputs, group = self.topic(log, 2), self.topic(log, 2), self.fresh("group")
        log.append(inputs, [Message("k", b"1")])
        old = log.consumer(group, [inputs], member_id="worker-1")
        records = self.poll_until(old, 1, "the record")
        new = log.consumer(group, [inputs], member_id="worker-1")
        with pytest.raises(Fenced):
            old.commit_with(derive(outputs, records))
        assert old.poll(timeout_s=0.1) == [] and old.assignment() == set()
        new.commit_with(derive(outputs, self.poll_until(new, 1, "the record, by the new instance")))
        assert values(self.read_all(log, outputs)) == [b"out:1"]

    def test_a_writer_waiting_for_the_lock_gets_it_once_free_and_gives_up_at_its_busy_timeout(self):
        from pipelines.eventlog.embedded_store import connect, take_write_lock

        log = self.opened()
        topic = self.topic(log, 1)
        holder = connect(str(self.path), busy_timeout_ms=5000, synchronous="NORMAL")
        waiter = connect(str(self.path), busy_timeout_ms=300, synchronous="NORMAL")
        try:
            holder.execute("BEGIN IMMEDIATE")
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                take_write_lock(waiter)  # held for longer than the waiter may wait
            assert waiter.execute("PRAGMA busy_timeout").fetchone()[0] == 300  # its own timeout is back
            waiter.busy_timeout_ms = 5000
            got: list[object] = []
            thread = threading.Thread(target=lambda: (take_write_lock(waiter), got.append(True)))
            thread.start()
            self.wait_for(lambda: thread.is_alive(), timeout_s=5, what="the waiter to start")
            assert not got  # still waiting while the lock is held
            holder.execute("COMMIT")
            thread.join(10)
            assert got == [True]
            waiter.execute("ROLLBACK")
            log.append(topic, [Message("k", b"after")])  # nobody was left holding it
            assert values(log.read(topic, 0, 0)) == [b"after"]
        finally:
            holder.close()
            waiter.close()


class TestKafkaEventLog(EventLogContract):
    @pytest.fixture(autouse=True)
    def _broker(self, kafka_test_servers):
        self.servers = kafka_test_servers  # called in the test body: no broker is a failure, not an error

    def open_log(self) -> EventLog:
        # Short sessions so a stalled member is dropped in seconds; the broker's minimum is 6 s.
        return KafkaEventLog(self.servers(), client_id="ledgerlm-contract", timeout_s=30.0,
                             group_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 500,
                                            "max_poll_interval_ms": 8000})

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


def test_open_event_log_picks_the_adapter_by_url(tmp_path):
    log = open_event_log(f"sqlite:///{tmp_path}/nested/dir/eventlog.db")
    try:
        assert isinstance(log, EmbeddedEventLog)
        assert (tmp_path / "nested" / "dir" / "eventlog.db").exists()
    finally:
        log.close()
    for bad in ("postgresql://x/y", "kafka://", "sqlite://", "eventlog.db"):
        with pytest.raises(ValueError, match="event log URL"):
            open_event_log(bad)
