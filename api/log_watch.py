"""Whether the event log is known to be away, so the API can say so at once.

Without this, every request met the outage afresh: its key check read the admin topic and
waited out the log's call timeout (`decision_timeout_s`, 5 s by default) before the 503.
Now the log is known to be away when

- a look of the watch's own (the requests topic's end, every `PROBE_EVERY_S`) fails or has
  run longer than `SLOW_S` (a frozen broker answers nothing, not even an error), or
- a route met a transient error of the log, or a log call that did not end in time
  (`api.outage`);

and back as soon as a look begun after the last failure succeeds (looks come every
`AWAY_EVERY_S` meanwhile). While it is away, keys are checked against the registry as last
read, a request that would write to the log is answered 503 `log_unavailable` without
touching it (`api.deps.current_principal`), and reads go on where they can.
"""
from __future__ import annotations

import asyncio
import logging
import time

from models import topics
from pipelines.eventlog import EventLog
from pipelines.outage import Readiness, is_transient

logger = logging.getLogger(__name__)


class LogWatch:
    PROBE_EVERY_S = 0.5
    AWAY_EVERY_S = 0.2
    # A look this slow counts as the log away. Well above what a loaded host takes for an
    # end offset, well below the log's call timeout.
    SLOW_S = 3.0

    def __init__(self, log: EventLog):
        self._log = log
        self.readiness = Readiness("api-log", stall_s=self.SLOW_S)
        self._failed_at = float("-inf")  # monotonic, the last failure seen
        self.looks = 0

    @property
    def away(self) -> bool:
        return not self.readiness.serving

    def failed(self, exc: BaseException | str) -> None:
        """A route met the log's failure (a transient error, or a call that did not end in time)."""
        self._failed_at = time.monotonic()
        self.readiness.down(exc)

    def look(self) -> None:
        """One look at the log, in the caller's thread: up if it answers, down if it fails."""
        began = time.monotonic()
        self.readiness.busy_since = began
        try:
            self._log.end_offset(topics.REQUESTS.name, 0)
        except Exception as exc:
            if not is_transient(exc):
                raise
            self.failed(exc)
            return
        finally:
            self.readiness.busy_since = None
            self.looks += 1
        if began > self._failed_at:  # a look begun before a failure proves nothing after it
            self.readiness.up()

    async def run(self) -> None:
        """Looks until cancelled: every `PROBE_EVERY_S`, or `AWAY_EVERY_S` while away."""
        while True:
            try:
                await asyncio.to_thread(self.look)
            except Exception:  # noqa: BLE001 - a bug in a look must not end the watch
                logger.exception("looking at the event log failed; looking again")
            await asyncio.sleep(self.AWAY_EVERY_S if self.away else self.PROBE_EVERY_S)
