"""The fleet view's tail: one open at a time, closed when it could not be placed and with the view."""
from __future__ import annotations

import pytest

from pipelines.fleet import FleetView


class PlacedTail:
    """A fleet topic tail whose seek fails while the broker is `away`."""

    def __init__(self, away: bool):
        self.offsets, self.away, self.closed = {0: 0}, away, False

    def seek_to_time(self, ms):
        if self.away:
            raise ConnectionError("broker away")

    def end_offsets(self):
        return {0: 0}

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
