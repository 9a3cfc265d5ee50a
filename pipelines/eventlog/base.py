"""The `EventLog` port: topics of partitions of ordered records, and consumer groups.

Two adapters implement it (`KafkaEventLog`, `EmbeddedEventLog`); one contract suite in
`tests/contract/test_eventlog.py` holds both to the same behaviour.

Commit order, written down once: outputs are flushed first, then input offsets are
committed. `GroupConsumer.commit_with(outputs)` does both atomically (a Kafka
transaction, or one SQLite transaction), so a crash anywhere redelivers the input and
leaves no output behind.
"""
from __future__ import annotations

import time
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Sequence


class EventLogError(RuntimeError):
    pass


class UnknownTopic(EventLogError):
    pass


class Fenced(EventLogError):
    """This consumer no longer owns a partition it tried to commit: a rebalance moved it."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    retention_ms: int | None = None  # None keeps records forever


@dataclass(frozen=True, slots=True)
class Message:
    """A record to append. Records with the same key land in the same partition, in order."""

    key: str
    value: bytes
    partition: int | None = None  # chosen from the key when None


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes
    timestamp_ms: int


TopicPartition = tuple[str, int]


def partition_for(key: str, partitions: int) -> int:
    """The partition of a key. Both adapters use this, so placement is identical."""
    return zlib.crc32(key.encode()) % partitions


class GroupConsumer(ABC):
    """One member of a consumer group. Partitions of its topics are split among members."""

    @abstractmethod
    def poll(self, *, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Records after the last position handed out, waiting up to `timeout_s` for some."""

    @abstractmethod
    def commit(self) -> None:
        """Commits the positions of every record returned by `poll` so far."""

    @abstractmethod
    def commit_with(
        self, outputs: Sequence[tuple[str, Message]], *, offsets: Mapping[TopicPartition, int] | None = None,
        on_committed: Callable[[], None] | None = None,
    ) -> None:
        """Appends `outputs` and commits the polled positions as one atomic unit.

        With `offsets` ({(topic, partition): next offset}), commits exactly those instead,
        and polling goes on from where it was: a consumer that reads ahead (the pool
        worker's fair share) commits only what it has finished.

        Returns once a reader that starts afterwards sees the outputs. `on_committed` is
        called as soon as the unit is committed, which may be earlier (on Kafka, before the
        commit markers land): readers already following see the outputs then or a moment
        later, in order, and anything appended after it comes after them.

        Raises `Fenced` (and writes nothing, and does not call `on_committed`) when a
        partition was reassigned meanwhile.
        """

    @abstractmethod
    def committed(self, topic: str, partition: int) -> int | None:
        """The group's next offset to read for that partition, or None if never committed."""

    def committed_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """`committed` of several partitions at once (adapters ask in one request: a pool
        worker owns dozens of work partitions and looks them all up at each assignment)."""
        return {tp: self.committed(*tp) for tp in partitions}

    def position(self, topic: str, partition: int) -> int | None:
        """The next offset a poll hands out from that partition, past any transaction
        markers; None where the adapter cannot tell without a read."""
        return None

    @abstractmethod
    def seek_to_committed(self) -> None:
        """Forgets positions handed out but not committed (after a failed unit of work)."""

    @abstractmethod
    def assignment(self) -> set[TopicPartition]:
        ...

    @abstractmethod
    def close(self) -> None:
        ...

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Tail:
    """Follows chosen partitions of one topic from given offsets, outside any group.

    This generic form reads partition by partition; adapters may offer a faster one. The
    positioning helpers (`end_offsets`, `low_offsets`, `seek`, `seek_to_time`) go through
    the log here; adapters' tails answer them on their own connection.
    """

    def __init__(self, log: "EventLog", topic: str, offsets: dict[int, int]):
        self._log, self._topic, self.offsets = log, topic, dict(offsets)

    def poll(self, *, max_records: int = 500, timeout_s: float = 0.5) -> list[Record]:
        deadline = time.monotonic() + timeout_s
        while True:
            out: list[Record] = []
            for partition, offset in self.offsets.items():
                batch = self._log.read(self._topic, partition, offset, max_records=max_records - len(out))
                if batch:
                    self.offsets[partition] = batch[-1].offset + 1
                    out += batch
                if len(out) >= max_records:
                    break
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                return out
            time.sleep(min(0.005, remaining))  # adapter-level wait, bounded by the caller's timeout

    def end_offsets(self) -> dict[int, int]:
        """The followed partitions' ends now: `poll` until `offsets` reach them to be caught up."""
        ends = self._log.end_offsets([(self._topic, p) for p in self.offsets])
        return {p: ends[self._topic, p] for p in self.offsets}

    def read_to(self, ends: Mapping[int, int] | None = None, *, timeout_s: float, max_records: int = 1000
                ) -> Iterator[Record]:
        """Polls until `offsets` reach `ends` (default: `end_offsets()` as of this call),
        yielding every record polled, in order; a poll may also return records past an end,
        and the tail has moved past them. Raises TimeoutError if the ends are not reached
        within `timeout_s`: a record known to be there did not come."""
        ends = self.end_offsets() if ends is None else dict(ends)
        return self._read_to(ends, time.monotonic() + timeout_s, max_records)

    def _read_to(self, ends: dict[int, int], deadline: float, max_records: int) -> Iterator[Record]:
        while any(self.offsets[p] < end for p, end in ends.items()):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"caught up only to {self.offsets} of {ends}")
            yield from self.poll(max_records=max_records, timeout_s=min(0.1, left))

    def low_offsets(self) -> dict[int, int]:
        """The first offset each followed partition still holds (0 where the log cannot say)."""
        low = getattr(self._log, "low_offset", None)
        return {p: low(self._topic, p) if low else 0 for p in self.offsets}

    def seek(self, partition: int, offset: int) -> None:
        """Reads `partition` from `offset` on."""
        self.offsets[partition] = offset

    def seek_to_time(self, timestamp_ms: int) -> None:
        """Moves each followed partition to its first record stamped at or after
        `timestamp_ms` (its end if none): a binary search, as producers stamp records in
        offset order up to clock skew."""
        for partition in list(self.offsets):
            hi = self._log.end_offset(self._topic, partition)
            first = self._log.read(self._topic, partition, 0, max_records=1)
            lo = first[0].offset if first else hi
            if first and first[0].timestamp_ms < timestamp_ms:
                lo += 1
                while lo < hi:
                    mid = (lo + hi) // 2
                    found = self._log.read(self._topic, partition, mid, max_records=1)
                    if not found or found[0].offset >= hi or found[0].timestamp_ms >= timestamp_ms:
                        hi = mid
                    else:
                        lo = found[0].offset + 1
            self.seek(partition, lo)

    def close(self) -> None:
        pass


class EventLog(ABC):
    @abstractmethod
    def ensure_topics(self, specs: Iterable[TopicSpec]) -> None:
        """Creates missing topics with their partition counts; existing ones are left alone."""

    @abstractmethod
    def partitions(self, topic: str) -> int:
        ...

    @abstractmethod
    def append(self, topic: str, messages: Sequence[Message]) -> list[Record]:
        """Appends durably (acknowledged by the log) and returns the records as stored."""

    @abstractmethod
    def read(
        self, topic: str, partition: int, offset: int, *, max_records: int = 500, timeout_s: float = 0.0
    ) -> list[Record]:
        """Records at `offset` and after, waiting up to `timeout_s` when there are none yet."""

    @abstractmethod
    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next appended record of that partition will get."""

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """`end_offset` of several partitions at once; adapters ask in one request."""
        return {tp: self.end_offset(*tp) for tp in partitions}

    @abstractmethod
    def consumer(self, group: str, topics: Sequence[str], *, member_id: str | None = None) -> GroupConsumer:
        ...

    def read_partition(self, topic: str, partition: int, from_offset: int = 0, *, page: int = 2000
                       ) -> Iterator[Record]:
        """Every record of the partition from `from_offset` up to its end as of this call, in
        order; records appended after the call are not read. `page`: records per `read`.

        Records `read` never returns (on Kafka, aborted or still-open transactions and the
        commit markers) are skipped as `read` skips them."""
        return self._read_range(topic, partition, from_offset, self.end_offset(topic, partition), page)

    def read_topic(self, topic: str, from_offsets: Mapping[int, int] | None = None, *, page: int = 2000
                   ) -> Iterator[Record]:
        """`read_partition` over several partitions, one after the other in partition order,
        every end fixed as of this call. `from_offsets` ({partition: offset}) names the
        partitions to read and where each starts; None reads every partition from its start."""
        if from_offsets is None:
            from_offsets = {p: 0 for p in range(self.partitions(topic))}
        ends = self.end_offsets([(topic, p) for p in sorted(from_offsets)])
        ranges = [(p, from_offsets[p], ends[topic, p]) for p in sorted(from_offsets)]
        return (record for p, start, end in ranges for record in self._read_range(topic, p, start, end, page))

    def _read_range(self, topic: str, partition: int, offset: int, end: int, page: int) -> Iterator[Record]:
        while offset < end:
            batch = self.read(topic, partition, offset, max_records=page)
            if not batch:
                return  # below `end` nothing readable is left (aborted records, transaction markers)
            for record in batch:
                if record.offset >= end:
                    return
                yield record
            offset = batch[-1].offset + 1

    def tail(self, topic: str, offsets: dict[int, int]) -> Tail:
        """Follows `offsets` ({partition: next offset}) of `topic`; every caller sees every record."""
        return Tail(self, topic, offsets)

    def evict(self, group: str, member_id: str) -> bool:
        """Drops the member `member_id` (as given to `consumer`) from `group` now, as its
        session timeout would later: for a member known to be gone (its process killed), so
        the others take its partitions over at once. A member that is in fact alive joins
        again at its next poll, and what it read before is fenced. True if it was a member."""
        raise NotImplementedError(f"{type(self).__name__} cannot evict group members")

    @abstractmethod
    def close(self) -> None:
        ...

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
