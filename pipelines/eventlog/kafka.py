"""`KafkaEventLog`: the event log on Apache Kafka, through kafka-python 3.

Placement is ours, not the client's: every record is sent to an explicit partition from
`partition_for`, so a key lands where the embedded log puts it. Everything is read
`read_committed`, so output of aborted or still-open transactions is never seen.
"""
from __future__ import annotations

import threading
import time
import uuid
from contextlib import contextmanager
from typing import Iterable, Sequence

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition as KafkaTP
from kafka import errors as kerr
from kafka.admin import MemberToRemove

from pipelines.eventlog.base import (
    EventLog, EventLogError, GroupConsumer, Message, Record, Tail, TopicPartition, TopicSpec, UnknownTopic,
    partition_for,
)
from pipelines.eventlog.kafka_clients import close_all, open_client
from pipelines.eventlog.kafka_groups import KafkaGroupConsumer, to_record

_TOPIC_ALREADY_EXISTS = kerr.TopicAlreadyExistsError.errno
_UNKNOWN_TOPIC = kerr.UnknownTopicOrPartitionError.errno
RECONNECT_BACKOFF_MAX_MS = 1000
# A group member silent this long is dropped by the broker (kafka-python's default is 45 s).
# Members known gone are evicted at once (`evict`), so this bounds only the wait where nobody
# knows; kept well above a broker restart or stall, which would otherwise drop every member
# at once (all their takes fenced, all groups rebalanced). Beats every second: after an
# eviction the survivors learn of the rebalance on their next beat.
GROUP_DEFAULTS = {"session_timeout_ms": 30_000, "heartbeat_interval_ms": 1_000}


class KafkaEventLog(EventLog):
    """`group_options` go to each group member's `KafkaConsumer` (session and heartbeat
    timeouts; tests lower them), `producer_options` to every `KafkaProducer`.
    `replication_factor`: copies of each partition of the topics it makes (None: the
    cluster's `default.replication.factor`)."""

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        client_id: str = "ledgerlm",
        timeout_s: float = 30.0,
        group_options: dict | None = None,
        producer_options: dict | None = None,
        security: dict | None = None,
        replication_factor: int | None = None,
    ):
        servers = [bootstrap_servers] if isinstance(bootstrap_servers, str) else list(bootstrap_servers)
        self._timeout_s = timeout_s
        self._replication_factor = -1 if replication_factor is None else replication_factor  # -1: the broker's
        self._client_id = client_id
        ms = int(timeout_s * 1000)
        # `security`: SASL and TLS options (pipelines.kafka_security), for every client it makes.
        # Reconnects back off to 1 s at most (the Java client's default; kafka-python's is 30 s),
        # so every client is back within a second of a broker that returns from an outage.
        self._common = dict(bootstrap_servers=servers, request_timeout_ms=ms, bootstrap_timeout_ms=ms,
                            reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS, **(security or {}))
        self._group_options = {**GROUP_DEFAULTS, **(group_options or {})}
        self._producer_options = dict(producer_options or {})
        try:
            self._admin = open_client(KafkaAdminClient, client_id=f"{client_id}-admin", **self._common)
        except kerr.KafkaError as exc:
            raise EventLogError(f"cannot reach Kafka at {','.join(servers)}: {exc!r}") from exc
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._admin_lock = threading.Lock()  # the admin client is not safe to share between threads
        self._partitions: dict[str, int] = {}
        self._producer: KafkaProducer | None = None
        self._reader: KafkaConsumer | None = None
        self._members: set[KafkaGroupConsumer] = set()
        self._tails: set = set()  # closed with the log

    def ensure_topics(self, specs: Iterable[TopicSpec]) -> None:
        specs = [s for s in specs if s.name not in self._partitions]
        if not specs:
            return
        # retention.ms=-1 spelled out: the broker default (7 days) would silently drop durable topics.
        wanted = {s.name: {"num_partitions": s.partitions, "replication_factor": self._replication_factor,
                           "configs": {"retention.ms": str(-1 if s.retention_ms is None else s.retention_ms)}}
                  for s in specs}
        result = self._admin.create_topics(wanted, timeout_ms=int(self._timeout_s * 1000), raise_errors=False)
        for topic in result["topics"]:
            if topic["error_code"] not in (0, _TOPIC_ALREADY_EXISTS):
                error = kerr.for_code(topic["error_code"])
                raise EventLogError(f"creating topic {topic['name']!r} failed: {error.__name__}")
        self._admin.wait_for_topics(list(wanted), timeout_ms=int(self._timeout_s * 1000))
        for spec in specs:
            self.partitions(spec.name)

    def partitions(self, topic: str) -> int:
        if topic not in self._partitions:
            with self._admin_lock:
                (info,) = self._admin.describe_topics([topic])
            if info["error_code"] == _UNKNOWN_TOPIC:
                raise UnknownTopic(f"topic {topic!r} does not exist; create it with ensure_topics")
            if info["error_code"]:
                raise EventLogError(f"describing {topic!r} failed: {kerr.for_code(info['error_code']).__name__}")
            # Partition counts only grow in Kafka and we never grow them, so caching is safe.
            self._partitions[topic] = len(info["partitions"])
        return self._partitions[topic]

    def place(self, topic: str, message: Message) -> int:
        """The partition `message` goes to: its own, or its key's."""
        if message.partition is not None:
            return self._check(topic, message.partition).partition
        return partition_for(message.key, self.partitions(topic))

    def _check(self, topic: str, partition: int) -> KafkaTP:
        n = self.partitions(topic)
        if not 0 <= partition < n:
            raise EventLogError(f"topic {topic!r} has {n} partitions; {partition} is out of range")
        return KafkaTP(topic, partition)

    def producer_config(self, **extra) -> dict:
        # Every send is followed by a flush, so lingering adds no latency; it only stops the
        # sender from waking (one syscall) for a one-record batch per send.
        options = {"linger_ms": 5, **self._producer_options}
        return dict(self._common, enable_idempotence=True, acks="all", max_block_ms=int(self._timeout_s * 1000),
                    **options, **extra)

    def consumer_config(self, **extra) -> dict:
        # Two settings keep kafka-python 3.0.12's consumer from sitting on a record that has
        # arrived (tests/contract/test_kafka_delivery.py; about one record in ten otherwise):
        # - no incremental fetch sessions: with them, a record on one of several partitions
        #   now and then waited until the fetch in flight timed out (fetch_max_wait_ms, 500 ms
        #   for a group member), as if the broker were not watching that partition for it.
        #   Without them, each fetch names every partition it reads;
        # - when no fetch could be sent, a poll sleeps retry_backoff_ms before looking again,
        #   deaf to new records: 100 ms by default. Retries after errors use the same backoff;
        #   10 ms is still no storm against a broker that answers.
        options = {"enable_incremental_fetch_sessions": False, "retry_backoff_ms": 10, **extra}
        return dict(self._common, isolation_level="read_committed", enable_auto_commit=False,
                    auto_offset_reset="earliest", allow_auto_create_topics=False, **options)

    def append(self, topic: str, messages: Sequence[Message]) -> list[Record]:
        if not messages:
            return []
        placed = [(self.place(topic, m), m) for m in messages]
        with self._lock:
            if self._producer is None:
                self._producer = open_client(KafkaProducer, **self.producer_config(client_id=self._client_id))
            producer = self._producer
        stamp = time.time_ns() // 1_000_000
        futures = [producer.send(topic, key=m.key.encode(), value=bytes(m.value), partition=p, timestamp_ms=stamp)
                   for p, m in placed]
        producer.flush(timeout=self._timeout_s)
        records = []
        for future, (partition, message) in zip(futures, placed):
            meta = future.get(timeout=self._timeout_s)
            records.append(Record(topic, partition, meta.offset, message.key, bytes(message.value),
                                  meta.timestamp if meta.timestamp >= 0 else stamp))
        return records

    @contextmanager
    def _reading(self):
        """The shared reader's lock; a reader whose lookup timed out is dropped, and the next
        call makes a new one. After a broker was cut off mid-request, kafka-python 3.0.12's
        consumer could stay without metadata once it was back, every lookup timing out for
        minutes (tests/e2e/test_kafka_cluster.py)."""
        with self._read_lock:
            try:
                yield
            except kerr.KafkaTimeoutError:
                reader, self._reader = self._reader, None
                if reader is not None:
                    try:
                        reader.close(autocommit=False, timeout_ms=0)
                    except Exception:  # noqa: BLE001 - a stuck client closing badly changes nothing here
                        pass
                raise

    def _reader_for(self, tp: KafkaTP) -> KafkaConsumer:
        if self._reader is None:
            # A short fetch wait. The consumer fetches ahead after each poll, and a read of
            # another partition waits until that fetch returns: at the broker's default wait
            # (500 ms; it was 100 here) every change of partition cost that long.
            self._reader = open_client(KafkaConsumer, **self.consumer_config(client_id=f"{self._client_id}-reader",
                                                                             fetch_max_wait_ms=5))
        if self._reader.assignment() != {tp}:
            self._reader.assign([tp])
        return self._reader

    def read(
        self, topic: str, partition: int, offset: int, *, max_records: int = 500, timeout_s: float = 0.0
    ) -> list[Record]:
        tp = self._check(topic, partition)
        start = time.monotonic()
        deadline = start + max(0.0, timeout_s)
        with self._reading():
            reader = self._reader_for(tp)
            # Without a wait of the caller's, whether committed records are there decides
            # whether to wait for a fetch. With one, the fetch goes first: a record known to
            # be there (a prompt, say) costs one round trip, not two.
            end = self._end(reader, tp) if timeout_s <= 0 else None
            reader.seek(tp, offset)
            while True:
                if end is not None and end > offset:
                    # Committed records are there; a fetch round trip may take longer than the caller's wait.
                    deadline = max(deadline, start + self._timeout_s)
                # Short slices: a poll over only aborted records would otherwise sit out the whole wait.
                left_s = max(0.0, min(deadline - time.monotonic(), 0.2))
                batch = reader.poll(timeout_ms=int(left_s * 1000), max_records=max_records).get(tp, [])
                if batch:
                    return [to_record(r) for r in batch]
                if end is None:
                    end = self._end(reader, tp)
                    continue
                if time.monotonic() >= deadline:
                    return []
                if end > offset and reader.position(tp, timeout_ms=int(self._timeout_s * 1000)) >= end:
                    # Only aborted records or transaction markers were there: back to the caller's wait.
                    deadline, end = start + max(0.0, timeout_s), offset

    def _end(self, reader: KafkaConsumer, tp: KafkaTP) -> int:
        return reader.end_offsets([tp], timeout_ms=int(self._timeout_s * 1000))[tp]

    def end_offset(self, topic: str, partition: int) -> int:
        """The last stable offset (`read_committed`): the end of the log when no transaction
        is open on that partition, otherwise the first offset of the oldest open one.

        Transactions leave a marker after their records, so offsets written by
        `commit_with` are not dense; `append` (no transaction) gives dense offsets.
        """
        tp = self._check(topic, partition)
        with self._reading():
            return self._end(self._reader_for(tp), tp)

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """`end_offset` of every partition in one ListOffsets request per broker."""
        wanted = [self._check(t, p) for t, p in partitions]
        if not wanted:
            return {}
        deadline = time.monotonic() + self._timeout_s
        ends: dict[KafkaTP, int] = {}
        with self._reading():
            reader = self._reader_for(wanted[0])
            while True:
                missing = [tp for tp in wanted if tp not in ends]
                left_ms = int((deadline - time.monotonic()) * 1000)
                if not missing or left_ms <= 0:
                    break
                try:
                    ends.update(reader.end_offsets(missing, timeout_ms=left_ms))
                except KeyError:
                    # kafka-python fails the whole call when a partition's topic is one the reader
                    # has not looked up yet (and starts the lookup): ask again in a moment.
                    time.sleep(0.005)
        if missing:
            raise EventLogError(f"no end offsets for {sorted(missing)} after {self._timeout_s}s")
        return {(tp.topic, tp.partition): ends[tp] for tp in wanted}

    def low_offset(self, topic: str, partition: int) -> int:
        """The first offset still stored; reads below it start there."""
        tp = self._check(topic, partition)
        with self._reading():
            reader = self._reader_for(tp)
            return reader.beginning_offsets([tp], timeout_ms=int(self._timeout_s * 1000))[tp]

    def tail(self, topic: str, offsets: dict[int, int]) -> Tail:
        from pipelines.eventlog.kafka_tail import KafkaTail  # one consumer long-polling every partition

        tail = KafkaTail(self, topic, offsets, on_close=self._tails.discard)
        self._tails.add(tail)
        return tail

    def evict(self, group: str, member_id: str) -> bool:
        # The broker names members by an id of its own; ours ends each member's client id
        # (`KafkaGroupConsumer`), whatever client id its process was given.
        with self._admin_lock:
            described = self._admin.describe_groups([group])
            found = [m["member_id"] for m in _group_members(described, group)
                     if str(m.get("client_id", "")).endswith(f"-{member_id}")]
            if not found:
                return False
            removed = self._admin.remove_group_members(group, [MemberToRemove(member_id=m) for m in found])
        refused = {m: e for m, e in removed.items() if e is not kerr.NoError and e is not kerr.UnknownMemberIdError}
        if refused:
            raise EventLogError(f"could not evict {member_id} from {group!r}: {refused}")
        return True

    def consumer(self, group: str, topics: Sequence[str], *, member_id: str | None = None) -> GroupConsumer:
        member = KafkaGroupConsumer(self, group, list(topics), member_id or uuid.uuid4().hex,
                                    client_id=self._client_id, group_options=self._group_options,
                                    timeout_s=self._timeout_s, on_close=self._members.discard)
        self._members.add(member)
        return member

    def close(self) -> None:
        """Closes every client it opened (members, tails, reader, producer, admin), each even
        when one before it fails: a leftover client keeps a thread and a connection."""
        reader, self._reader = self._reader, None
        producer, self._producer = self._producer, None
        close_all([*(member.close for member in list(self._members)), *(tail.close for tail in list(self._tails)),
                   *([lambda: reader.close(autocommit=False, timeout_ms=int(self._timeout_s * 1000))] if reader else []),
                   *([lambda: producer.close(timeout=self._timeout_s)] if producer else []),
                   self._admin.close])


def _group_members(described, group: str) -> list[dict]:
    """The members of `group` in what `describe_groups` returned (a dict by group id)."""
    entry = described.get(group) if isinstance(described, dict) else next(
        (g for g in described if g.get("group_id") == group), None)
    return list((entry or {}).get("members") or [])
