"""`KafkaTail`: follows partitions of one topic with one consumer of its own, assigned
all of them at once, so one fetch long-polls every partition and returns as soon as any
has a record. The generic `Tail` instead reads partition by partition through the log's
shared reader (a seek and a fetch each), which on Kafka costs a round trip per
partition per poll and sleeps between rounds.

No group: positions live only in `offsets`, as for every `Tail`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from kafka import KafkaConsumer, TopicPartition as KafkaTP

from pipelines.eventlog.base import Record, Tail
from pipelines.eventlog.kafka_groups import to_record

if TYPE_CHECKING:
    from pipelines.eventlog.kafka import KafkaEventLog


class KafkaTail(Tail):
    def __init__(self, log: "KafkaEventLog", topic: str, offsets: dict[int, int], *, fetch_max_wait_ms: int = 50):
        self._topic = topic
        self.offsets = dict(offsets)
        self._tps = {p: log._check(topic, p) for p in self.offsets}  # noqa: SLF001 - validates the range
        # A short broker-side wait: the fetch returns at the first record anyway, and a
        # short one keeps `poll(timeout_s)` close to the caller's timeout when idle.
        self._consumer = KafkaConsumer(**log.consumer_config(
            client_id=f"{log._client_id}-tail", fetch_max_wait_ms=fetch_max_wait_ms))  # noqa: SLF001
        self._consumer.assign(list(self._tps.values()))
        for partition, tp in self._tps.items():
            self._consumer.seek(tp, offsets[partition])

    def poll(self, *, max_records: int = 500, timeout_s: float = 0.5) -> list[Record]:
        batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        out: list[Record] = []
        for tp, batch in batches.items():
            if batch:
                out += [to_record(r) for r in batch]
                self.offsets[tp.partition] = batch[-1].offset + 1
        return out

    def close(self) -> None:
        self._consumer.close(autocommit=False)

