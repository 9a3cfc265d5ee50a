"""A new owner of a work partition starts nothing there before it has read to where the
partition ended at assignment; past a trailing transaction marker, the consumer's position
says so without a read."""
from __future__ import annotations

from workers.work_positions import WorkPositions

TP = ("work", 3)


class Log:
    def __init__(self, left: list):
        self.left, self.reads = left, 0

    def read(self, topic, partition, offset, *, max_records=500, timeout_s=0.0):
        self.reads += 1
        return self.left[:max_records]


class Consumer:
    def __init__(self, position):
        self.at = position

    def position(self, topic, partition):
        return self.at


def positions(read: int, target: int) -> WorkPositions:
    return WorkPositions(read={TP: read}, catch_up={TP: target})


def test_a_partition_read_to_its_end_at_assignment_is_ready_without_a_read():
    log = Log(["a record"])
    assert positions(read=10, target=10).ready(TP, log) and log.reads == 0


def test_records_left_below_the_end_keep_it_waiting():
    log = Log(["a record"])
    mine = positions(read=8, target=10)
    assert not mine.ready(TP, log, Consumer(8))
    assert not mine.ready(TP, log, Consumer(None))
    assert TP in mine.catch_up


def test_past_a_marker_the_consumers_position_says_ready_with_no_read():
    log = Log([])
    mine = positions(read=9, target=10)  # offset 9 is the marker of the last transaction
    assert mine.ready(TP, log, Consumer(10)) and log.reads == 0
    assert TP not in mine.catch_up


def test_without_a_position_a_read_that_finds_nothing_says_ready():
    log = Log([])
    assert positions(read=9, target=10).ready(TP, log, Consumer(None)) and log.reads == 1


class Batched:
    """A log and a group consumer that answer only batched look-ups, counting them."""

    def __init__(self, committed: dict, ends: dict):
        self._committed, self._ends, self.calls = committed, ends, []

    def committed_offsets(self, partitions):
        self.calls.append("committed_offsets")
        return {tp: self._committed.get(tp) for tp in partitions}

    def end_offsets(self, partitions):
        self.calls.append("end_offsets")
        return {tp: self._ends[tp] for tp in partitions}


def test_at_assignment_looks_every_partition_up_in_two_requests():
    owned = {("work", p) for p in range(32)}
    both = Batched(committed={("work", 0): 5}, ends={tp: 7 for tp in owned})
    mine = WorkPositions.at_assignment(both, both, owned)
    assert sorted(both.calls) == ["committed_offsets", "end_offsets"]
    assert mine.read == {tp: 5 if tp == ("work", 0) else 0 for tp in owned}, "never committed reads from 0"
    assert mine.catch_up == {tp: 7 for tp in owned}
    assert WorkPositions.at_assignment(both, both, set()).read == {} and len(both.calls) == 2
