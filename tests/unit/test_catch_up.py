"""`pipelines.admission.catch_up.CatchUp`: when a member last read all of its input."""
from __future__ import annotations

from datetime import datetime, timezone

from pipelines.admission.catch_up import CatchUp


class Member:
    def __init__(self, positions):
        self.positions = positions

    def assignment(self):
        return set(self.positions)

    def position(self, topic, partition):
        return self.positions[(topic, partition)]


class Log:
    def __init__(self, ends):
        self.ends, self.asked = ends, 0

    def end_offsets(self, partitions):
        self.asked += 1
        return {tp: self.ends[tp] for tp in partitions}


POLLED_AT = datetime(2026, 12, 5, 8, 0, tzinfo=timezone.utc)


def test_a_member_behind_an_end_offset_has_not_read_all_and_one_at_every_end_has():
    member, log = Member({("requests", 0): 7, ("outcomes", 0): 3}), Log({("requests", 0): 7, ("outcomes", 0): 4})
    assert CatchUp(log, member, every_s=0).read_all_at(POLLED_AT) is None  # an end waits on outcomes/0
    member.positions[("outcomes", 0)] = 4
    read_to = CatchUp(log, member, every_s=0).read_all_at(POLLED_AT)
    assert read_to is not None and read_to >= POLLED_AT


def test_it_asks_at_most_once_per_interval():
    member, log = Member({("requests", 0): 1}), Log({("requests", 0): 1})
    catch_up = CatchUp(log, member, every_s=60)
    assert catch_up.read_all_at(POLLED_AT) is not None
    assert catch_up.read_all_at(POLLED_AT) is None
    assert log.asked == 1


def test_a_log_that_tells_no_positions_read_to_the_polls_start():
    member, log = Member({("requests", 0): None}), Log({})
    assert CatchUp(log, member, every_s=0).read_all_at(POLLED_AT) == POLLED_AT
    assert log.asked == 0
