"""What the API knows of batches and files: a `BatchBook` kept up to date by reading the
batches topic from where it left off (like `RegistryView` for admin events). A
projection in memory, rebuilt from the log on start; it folds the events exactly as the
dispatcher does, so a client sees the state the dispatcher acts on."""
from __future__ import annotations

import threading

from models import topics
from models.batch import BatchBook, BatchState, FileState
from models.events import EventDecodeError, decode
from pipelines.eventlog import EventLog


class BatchView:
    def __init__(self, log: EventLog):
        self._log = log
        self._lock = threading.Lock()
        self._next: dict[int, int] = {}
        self.book = BatchBook()

    def refresh(self) -> BatchBook:
        with self._lock:
            if not self._next:
                self._next = {p: 0 for p in range(self._log.partitions(topics.BATCHES.name))}
            for partition, offset in self._next.items():
                while records := self._log.read(topics.BATCHES.name, partition, offset, max_records=2000):
                    for record in records:
                        try:
                            self.book.apply(decode(record.value))
                        except EventDecodeError:
                            pass  # the dispatcher counts and logs unreadable records
                    offset = records[-1].offset + 1
                self._next[partition] = offset
            return self.book

    def batch(self, tenant_id: str, batch_id: str) -> BatchState | None:
        """The tenant's own batch; another tenant's is as absent as a missing one."""
        return self.refresh().batches.get((tenant_id, batch_id))

    def file(self, tenant_id: str, file_id: str) -> FileState | None:
        return self.refresh().files.get((tenant_id, file_id))
