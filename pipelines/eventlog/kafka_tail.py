"""`KafkaTail`: follows partitions of one topic with one consumer of its own, assigned
all of them at once, so one fetch long-polls every partition and returns as soon as any
has a record. The generic `Tail` instead reads partition by partition through the log's
shared reader (a seek and a fetch each), which on Kafka costs a round trip per
partition per poll and sleeps between rounds.

No group: positions live only in `offsets`, as for every `Tail`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from kafka import KafkaConsumer
from kafka.errors import KafkaTimeoutError

from pipelines.eventlog.base import Record, Tail
from pipelines.eventlog.kafka_clients import open_client
from pipelines.eventlog.kafka_groups import to_record

if TYPE_CHECKING:
    from pipelines.eventlog.kafka import KafkaEventLog


class KafkaTail(Tail):
    def __init__(self, log: "KafkaEventLog", topic: str, offsets: dict[int, int], *, fetch_max_wait_ms: int = 50,
                 on_close: Callable[["KafkaTail"], None] | None = None):
        self._log, self._topic, self._on_close = log, topic, on_close
        self.offsets = dict(offsets)
        self._timeout_ms = int(log._timeout_s * 1000)  # noqa: SLF001
        self._tps = {p: log._check(topic, p) for p in self.offsets}  # noqa: SLF001 - validates the range
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._consumer = self._open()

    def _open(self) -> KafkaConsumer:
        # A short broker-side wait: the fetch returns at the first record anyway, and a
        # short one keeps `poll(timeout_s)` close to the caller's timeout when idle.
        consumer = open_client(KafkaConsumer, **self._log.consumer_config(
            client_id=f"{self._log._client_id}-tail", fetch_max_wait_ms=self._fetch_max_wait_ms))  # noqa: SLF001
        try:
            consumer.assign(list(self._tps.values()))
            for partition, tp in self._tps.items():
                consumer.seek(tp, self.offsets[partition])
        except BaseException:
            consumer.close(autocommit=False, timeout_ms=0)
            raise
        return consumer

    def _lookup(self, ask: Callable[[KafkaConsumer], dict]) -> dict:
        """`ask` of the consumer; one that timed out is replaced before the error goes up.
        After a broker was cut off mid-request, kafka-python 3.0.12's consumer could stay
        without metadata once it was back, each lookup timing out for minutes
        (tests/e2e/test_kafka_cluster.py); a new one starts clean at the same positions."""
        try:
            return ask(self._consumer)
        except KafkaTimeoutError:
            stuck, self._consumer = self._consumer, self._open()
            try:
                stuck.close(autocommit=False, timeout_ms=0)
            except Exception:  # noqa: BLE001 - a stuck client closing badly changes nothing here
                pass
            raise

    def poll(self, *, max_records: int = 500, timeout_s: float = 0.5) -> list[Record]:
        batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        out: list[Record] = []
        for tp, batch in batches.items():
            out += [to_record(r) for r in batch]
        for partition, tp in self._tps.items():
            # The consumer's position, not the last record's offset + 1: it also steps over
            # transaction markers, so `offsets` reaches `end_offsets()` when caught up.
            position = self._consumer._subscription.position(tp)  # noqa: SLF001 - local, no network call
            if position is not None:
                self.offsets[partition] = getattr(position, "offset", position)
        return out

    def end_offsets(self) -> dict[int, int]:
        ends = self._lookup(lambda c: c.end_offsets(list(self._tps.values()), timeout_ms=self._timeout_ms))
        return {tp.partition: offset for tp, offset in ends.items()}

    def low_offsets(self) -> dict[int, int]:
        lows = self._lookup(lambda c: c.beginning_offsets(list(self._tps.values()), timeout_ms=self._timeout_ms))
        return {tp.partition: offset for tp, offset in lows.items()}

    def seek(self, partition: int, offset: int) -> None:
        self._consumer.seek(self._tps[partition], offset)
        self.offsets[partition] = offset

    def seek_to_time(self, timestamp_ms: int) -> None:
        found = self._lookup(lambda c: c.offsets_for_times({tp: timestamp_ms for tp in self._tps.values()},
                                                           timeout_ms=self._timeout_ms))
        ends = self.end_offsets()
        for partition, tp in self._tps.items():
            at = found.get(tp)
            self.seek(partition, at.offset if at is not None else ends[partition])

    def close(self) -> None:
        try:
            self._consumer.close(autocommit=False)
        finally:
            if self._on_close is not None:
                self._on_close(self)
