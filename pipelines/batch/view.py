"""What the API knows of batches and files: a `BatchBook` kept up to date by reading the
batches topic from where it left off (like `RegistryView` for admin events). A
projection in memory, rebuilt from the log on start; it folds the events exactly as the
dispatcher does, so a client sees the state the dispatcher acts on.

The topic is keyed by tenant, so everything of a tenant is in one partition: a request
reads only its tenant's partition, up to its end, and so sees its own writes.
"""
from __future__ import annotations

import threading

from models import topics
from models.batch import BatchBook, BatchState, FileState
from models.events import EventDecodeError, decode
from pipelines.eventlog import EventLog, partition_for


class BatchView:
    def __init__(self, log: EventLog):
        self._log = log
        self._lock = threading.Lock()
        self._next: dict[int, int] = {}
        self._partitions: int | None = None
        self.book = BatchBook()

    def refresh(self, tenant_id: str) -> BatchBook:
        """The book, with the tenant's partition read to its end."""
        with self._lock:
            if self._partitions is None:
                self._partitions = self._log.partitions(topics.BATCHES.name)
            partition = partition_for(tenant_id, self._partitions)
            for record in self._log.read_partition(topics.BATCHES.name, partition, self._next.get(partition, 0)):
                try:
                    self.book.apply(decode(record.value))
                except EventDecodeError:
                    pass  # the dispatcher counts and logs unreadable records
                self._next[partition] = record.offset + 1
            return self.book

    def batch(self, tenant_id: str, batch_id: str) -> BatchState | None:
        """The tenant's own batch; another tenant's is as absent as a missing one."""
        return self.refresh(tenant_id).batches.get((tenant_id, batch_id))

    def batches_of(self, tenant_id: str) -> list[BatchState]:
        return self.refresh(tenant_id).for_tenant(tenant_id)

    def file(self, tenant_id: str, file_id: str) -> FileState | None:
        return self.refresh(tenant_id).files.get((tenant_id, file_id))

    def files_of(self, tenant_id: str) -> list[FileState]:
        return [f for (t, _), f in self.refresh(tenant_id).files.items() if t == tenant_id]
