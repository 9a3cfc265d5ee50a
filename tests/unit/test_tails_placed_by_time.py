"""Readers that place a tail by time (the fleet view, the request index) close one they
could not place, so a log that keeps failing does not gather tails, one per try."""
from __future__ import annotations

import pytest

from pipelines.fleet import FleetView
from pipelines.generation.request_index import RequestIndex


class PlacedTail:
    """A fleet topic tail whose seek fails while the broker is `away`."""

    def __init__(self, away: bool):
        self.offsets, self.away, self.closed = {0: 0}, away, False

    def seek_to_time(self, ms):
        if self.away:
            raise ConnectionError("broker away")

    def end_offsets(self):
        return {0: 0}

    def read_to(self, ends, *, timeout_s, max_records):
        return iter(())

    def close(self):
        self.closed = True


class Log:
    def __init__(self, failing: int):
        self.failing, self.tails = failing, []

    def partitions(self, name):
        return 1

    def tail(self, name, offsets):
        self.tails.append(PlacedTail(away=len(self.tails) < self.failing))
        return self.tails[-1]


def test_a_tail_that_could_not_be_placed_is_closed_and_the_next_refresh_opens_one():
    log = Log(failing=2)
    view = FleetView(log)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            view.refresh()
    view.refresh()
    view.refresh()
    assert [t.closed for t in log.tails] == [True, True, False]
    view.close()
    assert [t.closed for t in log.tails] == [True, True, True]


def test_the_request_index_closes_a_tail_it_could_not_place_and_keeps_the_one_it_did():
    log = Log(failing=2)
    index = RequestIndex(log)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            index.request("t1", "r1")
    assert index.request("t1", "r1") is None and index.request("t1", "r2") is None
    assert [t.closed for t in log.tails] == [True, True, False]
    index.close()
    assert [t.closed for t in log.tails] == [True, True, True]
