"""Where a pool worker stands in each work partition it owns.

The worker reads ahead (fair share needs to see past one tenant's backlog) but commits
only up to its first item not yet taken, so a crash hands every untaken item to the next
owner. Items taken out of order sit beyond that commit point; the worker marks each taken
item by writing its `GenerationStarted` (or its early end) to the item's own partition,
in the same commit. A new owner reads a partition up to where it ended at assignment
before starting any of its items, so it sees every mark and starts nothing twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.eventlog import EventLog, GroupConsumer, Record, TopicPartition


@dataclass
class WorkPositions:
    read: dict[TopicPartition, int] = field(default_factory=dict)  # next offset to read
    held: dict[TopicPartition, set[int]] = field(default_factory=dict)  # offsets of items queued here
    catch_up: dict[TopicPartition, int] = field(default_factory=dict)  # read this far before starting any

    @classmethod
    def at_assignment(cls, log: EventLog, consumer: GroupConsumer, assigned: set[TopicPartition]) -> "WorkPositions":
        """Where each assigned partition stands: two batched look-ups, not two round trips
        per partition (a worker owns dozens of them, `models.topics.WORK_PARTITIONS`)."""
        positions = cls()
        if not assigned:
            return positions
        committed = consumer.committed_offsets(assigned)
        positions.catch_up = log.end_offsets(assigned)
        positions.read = {tp: committed.get(tp) or 0 for tp in assigned}
        return positions

    def saw(self, record: Record) -> None:
        tp = (record.topic, record.partition)
        self.read[tp] = max(self.read.get(tp, 0), record.offset + 1)

    def hold(self, tp: TopicPartition, offset: int) -> None:
        self.held.setdefault(tp, set()).add(offset)

    def release(self, tp: TopicPartition, offset: int) -> None:
        self.held.get(tp, set()).discard(offset)

    def ready(self, tp: TopicPartition, log: EventLog, consumer: GroupConsumer | None = None) -> bool:
        """Read up to where the partition ended at assignment (or nothing is left to read:
        transaction markers take offsets that no record has). The consumer's position, where
        it knows one, says so without a read: on Kafka a read that finds only a marker costs
        a fetch wait, and a worker owns many partitions (`models.topics.WORK_PARTITIONS`)."""
        target = self.catch_up.get(tp)
        if target is None:
            return True
        read = self.read.get(tp, 0)
        if (read >= target or (consumer is not None and (consumer.position(*tp) or 0) >= target)
                or not log.read(tp[0], tp[1], read, max_records=1)):
            del self.catch_up[tp]
            return True
        return False

    def commit_offsets(self) -> dict[TopicPartition, int]:
        """Per partition: its first held offset, or all that was read when nothing is held."""
        return {tp: min(self.held[tp]) if self.held.get(tp) else offset for tp, offset in self.read.items()}
