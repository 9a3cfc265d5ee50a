"""The `EventLog` contract, part two: consumer groups (committed positions, redelivery,
`commit_with` units, fencing, splitting partitions), run unchanged against every adapter,
and what only the embedded log promises (retention, one file shared by processes, locks).
Reads and offsets are in `test_eventlog_reads.py`."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from pipelines.eventlog import Fenced, GroupConsumer, Message, Record, TopicSpec, UnknownTopic, open_event_log
from pipelines.eventlog.embedded import EmbeddedEventLog
from tests.contract.eventlog_contract import (
    GROUP_WAIT_S, EventLogContract, OnEmbedded, OnKafka, derive, values,
)


class GroupContract(EventLogContract):
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

    def test_an_evicted_member_s_partitions_move_at_once(self):
        """A member gone silent (its process killed) holds its partitions until the group's
        session timeout; evicted, they move to the others within seconds."""
        log = self.open_slow_session_log()
        self._opened.append(log)
        inputs, group = self.topic(log, 4), self.fresh("group")
        members = {name: log.consumer(group, [inputs], member_id=name) for name in ("silent", "survivor")}
        assignments = {name: set() for name in members}
        polling = {name: threading.Event() for name in members}
        failures: list[BaseException] = []
        done = threading.Event()

        def work(name: str) -> None:
            try:
                polling[name].set()
                while not done.is_set() and polling[name].is_set():
                    members[name].poll(timeout_s=0.1)
                    assignments[name] = members[name].assignment()
            except BaseException as exc:  # surfaced by the main thread
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(name,), daemon=True) for name in members]
        for t in threads:
            t.start()
        try:
            everything = {(inputs, p) for p in range(4)}
            self.wait_for(lambda: failures or (assignments["silent"] and assignments["survivor"]
                                               and assignments["silent"] | assignments["survivor"] == everything),
                          timeout_s=GROUP_WAIT_S, what="the two members to split the partitions")
            polling["silent"].clear()  # it stops dead: no poll, no close, no leave
            threads[0].join(30)
            assert not threads[0].is_alive(), "the silent member's loop did not stop"
            assert log.evict(group, "nobody") is False
            evicted_at = time.monotonic()
            assert log.evict(group, "silent") is True
            self.wait_for(lambda: failures or assignments["survivor"] == everything, timeout_s=30,
                          what="the evicted member's partitions to move to the survivor")
            moved_s = time.monotonic() - evicted_at
        finally:
            done.set()
            for t in threads:
                t.join(60)
        assert not failures, failures
        assert moved_s < 20, f"{moved_s:.1f} s: no faster than the group's session timeout"
        # The survivor reads what lands on every partition now.
        log.append(inputs, [Message(f"tenant-{i}", b"%d" % i) for i in range(8)])
        assert len(self.poll_until(members["survivor"], 8, "every record, on the survivor")) == 8

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


class TestEmbeddedEventLog(OnEmbedded, GroupContract):
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


class TestKafkaEventLog(OnKafka, GroupContract):
    pass


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
