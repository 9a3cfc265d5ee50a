"""An `EventLog` whose topics and groups live under a namespace prefix, so several
environments (or test sessions) can share one Kafka cluster without seeing each other."""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from pipelines.eventlog.base import EventLog, GroupConsumer, Message, Record, Tail, TopicPartition, TopicSpec


class _Names:
    def __init__(self, prefix: str):
        self.prefix = prefix

    def outer(self, topic: str) -> str:
        return self.prefix + topic

    def inner(self, record: Record) -> Record:
        return replace(record, topic=record.topic[len(self.prefix):])

    def inner_tp(self, tp: TopicPartition) -> TopicPartition:
        return tp[0][len(self.prefix):], tp[1]


class _NamespacedConsumer(GroupConsumer):
    def __init__(self, inner: GroupConsumer, names: _Names):
        self._inner, self._names = inner, names

    def poll(self, *, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        return [self._names.inner(r) for r in self._inner.poll(max_records=max_records, timeout_s=timeout_s)]

    def commit(self) -> None:
        self._inner.commit()

    def commit_with(self, outputs: Sequence[tuple[str, Message]], *, offsets=None, on_committed=None) -> None:
        if offsets is not None:
            offsets = {(self._names.outer(t), p): o for (t, p), o in offsets.items()}
        self._inner.commit_with([(self._names.outer(t), m) for t, m in outputs], offsets=offsets,
                                on_committed=on_committed)

    def committed(self, topic: str, partition: int) -> int | None:
        return self._inner.committed(self._names.outer(topic), partition)

    def committed_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        found = self._inner.committed_offsets([(self._names.outer(t), p) for t, p in partitions])
        return {self._names.inner_tp(tp): offset for tp, offset in found.items()}

    def position(self, topic: str, partition: int) -> int | None:
        return self._inner.position(self._names.outer(topic), partition)

    def seek_to_committed(self) -> None:
        self._inner.seek_to_committed()

    def assignment(self) -> set[TopicPartition]:
        return {self._names.inner_tp(tp) for tp in self._inner.assignment()}

    def close(self) -> None:
        self._inner.close()


class _NamespacedTail(Tail):
    def __init__(self, inner: Tail, names: _Names):
        self._inner, self._names = inner, names

    @property
    def offsets(self) -> dict[int, int]:
        return self._inner.offsets

    def poll(self, *, max_records: int = 500, timeout_s: float = 0.5) -> list[Record]:
        return [self._names.inner(r) for r in self._inner.poll(max_records=max_records, timeout_s=timeout_s)]

    def end_offsets(self) -> dict[int, int]:
        return self._inner.end_offsets()

    def low_offsets(self) -> dict[int, int]:
        return self._inner.low_offsets()

    def seek(self, partition: int, offset: int) -> None:
        self._inner.seek(partition, offset)

    def seek_to_time(self, timestamp_ms: int) -> None:
        self._inner.seek_to_time(timestamp_ms)

    def close(self) -> None:
        self._inner.close()


class NamespacedEventLog(EventLog):
    def __init__(self, inner: EventLog, namespace: str):
        self.inner = inner
        self._names = _Names(namespace.rstrip(".") + ".")

    def ensure_topics(self, specs: Iterable[TopicSpec]) -> None:
        self.inner.ensure_topics([replace(s, name=self._names.outer(s.name)) for s in specs])

    def partitions(self, topic: str) -> int:
        return self.inner.partitions(self._names.outer(topic))

    def append(self, topic: str, messages: Sequence[Message]) -> list[Record]:
        return [self._names.inner(r) for r in self.inner.append(self._names.outer(topic), messages)]

    def read(self, topic: str, partition: int, offset: int, *, max_records: int = 500,
             timeout_s: float = 0.0) -> list[Record]:
        records = self.inner.read(self._names.outer(topic), partition, offset, max_records=max_records,
                                  timeout_s=timeout_s)
        return [self._names.inner(r) for r in records]

    def end_offset(self, topic: str, partition: int) -> int:
        return self.inner.end_offset(self._names.outer(topic), partition)

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        ends = self.inner.end_offsets([(self._names.outer(t), p) for t, p in partitions])
        return {self._names.inner_tp(tp): offset for tp, offset in ends.items()}

    def consumer(self, group: str, topics: Sequence[str], *, member_id: str | None = None) -> GroupConsumer:
        inner = self.inner.consumer(self._names.prefix + group, [self._names.outer(t) for t in topics],
                                    member_id=member_id)
        return _NamespacedConsumer(inner, self._names)

    def evict(self, group: str, member_id: str) -> bool:
        return self.inner.evict(self._names.prefix + group, member_id)

    def tail(self, topic: str, offsets: dict[int, int]) -> Tail:
        return _NamespacedTail(self.inner.tail(self._names.outer(topic), offsets), self._names)

    def close(self) -> None:
        self.inner.close()
