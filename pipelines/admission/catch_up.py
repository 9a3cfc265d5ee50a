"""When a group member last read all of its input: the clock a processor judges by when it
decides that something did not happen (a reservation overdue, a worker lost), so that what
did happen, but still waits to be read, is decided first."""
from __future__ import annotations

import time
from datetime import datetime, timezone

from pipelines.eventlog import EventLog, GroupConsumer


class CatchUp:
    """On a log that tells positions (Kafka), a poll that was not full may still leave records
    on their way (a fetch in flight, or a failover): the member has read all of its input
    appended before a time once every partition it owns is read to the end offsets asked
    then. Elsewhere such a poll read to its start. Checked at most every `every_s`."""

    def __init__(self, log: EventLog, consumer: GroupConsumer, *, every_s: float = 0.25):
        self._log, self._consumer, self._every_s = log, consumer, every_s
        self._due = 0.0

    def read_all_at(self, polled_at: datetime) -> datetime | None:
        """After a poll that was not full and began at `polled_at`: when the member last read
        all of its input appended before then; None between checks, or when not caught up."""
        if time.monotonic() < self._due:
            return None
        self._due = time.monotonic() + self._every_s
        owned = sorted(self._consumer.assignment())
        positions = [self._consumer.position(t, p) for t, p in owned]
        if None in positions:
            return polled_at
        asked_at = datetime.now(timezone.utc)
        ends = self._log.end_offsets(owned)
        return asked_at if all(at >= ends[tp] for tp, at in zip(owned, positions)) else None
