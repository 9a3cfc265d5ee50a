"""A Kafka consumer-group member whose `commit_with` is one Kafka transaction.

Each member has its own transactional producer, `transactional_id = f"{group}-{member_id}"`,
so a member restarted under the same id aborts whatever its previous life left open.
Offsets go into the transaction with the consumer's group metadata (KIP-447), so the
broker refuses a commit from a member that a rebalance has replaced.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer, OffsetAndMetadata
from kafka import TopicPartition as KafkaTP
from kafka import errors as kerr
from kafka.structs import MemberState

from pipelines.eventlog.base import EventLogError, Fenced, GroupConsumer, Message, Record, TopicPartition
from pipelines.eventlog.kafka_clients import close_all, open_client

if TYPE_CHECKING:
    from pipelines.eventlog.kafka import KafkaEventLog

logger = logging.getLogger(__name__)

# The member or its producer was replaced: nothing it commits may count.
FENCING_ERRORS = (
    kerr.CommitFailedError, kerr.IllegalGenerationError, kerr.UnknownMemberIdError, kerr.RebalanceInProgressError,
    kerr.FencedInstanceIdError, kerr.ProducerFencedError, kerr.InvalidProducerEpochError,
)
ZOMBIE_ERRORS = (kerr.ProducerFencedError, kerr.InvalidProducerEpochError)
# The broker unreachable or silent: the transaction's outcome is unknown to this producer.
UNREACHABLE_ERRORS = (kerr.KafkaTimeoutError, kerr.KafkaConnectionError,
                      kerr.RequestTimedOutError, kerr.NodeNotReadyError)


def to_record(r) -> Record:
    return Record(r.topic, r.partition, r.offset, None if r.key is None else r.key.decode(), r.value, r.timestamp)


TXN_RETRY_BACKOFF_MS = 5


def run_txn_step(producer: KafkaProducer, step: str, *args, timeout_s: float) -> None:
    """One transaction step with a deadline. kafka-python 3.0's public `commit_transaction`,
    `abort_transaction` and `send_offsets_to_transaction` wait forever; these are their
    bodies (TransactionManager call, sender wakeup, wait) with a bound on the wait."""
    result = getattr(producer._transaction_manager, step)(*args)
    producer._sender.wakeup()
    if not result.wait(timeout_ms=timeout_s * 1000):
        raise kerr.KafkaTimeoutError(f"transaction step {step} did not finish in {timeout_s}s")


class _Revocations(ConsumerRebalanceListener):
    def __init__(self, member: "KafkaGroupConsumer"):
        self._member = member

    def on_partitions_revoked(self, revoked):
        self._member._revoked(revoked)

    def on_partitions_assigned(self, assigned):
        pass


class KafkaGroupConsumer(GroupConsumer):
    """Use from one thread (kafka-python consumers are not thread safe)."""

    def __init__(self, log: "KafkaEventLog", group: str, topics: list[str], member_id: str, *, client_id: str,
                 group_options: dict, timeout_s: float, on_close: Callable[["KafkaGroupConsumer"], None]):
        self._log = log
        self._group = group
        self.member_id = member_id
        self._timeout_s = timeout_s
        self._on_close = on_close
        self._consumer = open_client(KafkaConsumer, **log.consumer_config(
            group_id=group, client_id=f"{client_id}-{member_id}", **group_options))
        try:
            self._consumer.subscribe(topics=topics, listener=_Revocations(self))
        except BaseException:
            self._consumer.close(autocommit=False, timeout_ms=0)
            raise
        # What kafka-python itself allows a JoinGroup round trip: the broker's rebalance timeout plus slack.
        self._join_timeout_ms = self._consumer.config["max_poll_interval_ms"] + 5000
        self._producer: KafkaProducer | None = None
        self._positions: dict[KafkaTP, int] = {}  # handed out by poll, not yet committed
        self._polled_under = None  # group metadata when the first of those was handed out
        self._stale = False  # records were handed out from partitions a rebalance took away
        self._zombie = False  # a newer producer with our transactional id exists
        self._unresolved = False  # a unit failed, and its transaction may not be complete yet
        self._closed = False

    def _revoked(self, revoked) -> None:
        if any(tp in self._positions for tp in revoked):
            self._stale = True
        for tp in revoked:
            self._positions.pop(tp, None)

    def _ensure_joined(self) -> None:
        """Awaits a pending group (re)join, up to the rebalance timeout, before polling.

        kafka-python 3.0.12 drops a join that completes after a short `poll` stopped waiting
        for it: the member never applies its assignment and stops heartbeating, so it sits out
        of the group for good. So no join is left to a short poll; a member whose last join
        was dropped that way (rebalancing, yet no rejoin pending) is told to join again.
        """
        coordinator = self._consumer._coordinator
        stable = self._consumer.group_metadata().state == MemberState.STABLE
        if stable and not coordinator.need_rejoin():
            return
        if not stable and not coordinator.need_rejoin():
            coordinator.request_rejoin()
        coordinator.ensure_active_group(timeout_ms=self._join_timeout_ms)

    def poll(self, *, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Waits up to `timeout_s` for records; a rebalance in progress is waited out first."""
        self._ensure_joined()
        batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        records = []
        for tp, batch in batches.items():
            if not batch:
                continue
            if not self._positions:
                self._polled_under = self._consumer.group_metadata()
            records += [to_record(r) for r in batch]
            self._positions[tp] = batch[-1].offset + 1
        return records

    def _membership(self):
        """The group metadata the pending positions were read under, if it still holds."""
        if self._zombie:
            self._fence("a newer instance with this member id took over")
        if self._stale:
            self._fence("records were polled before a rebalance")
        current = self._consumer.group_metadata()
        under = self._polled_under if self._positions else current
        # Leaving the group (poll interval exceeded) resets the generation to -1, and the
        # broker checks nothing for -1: refuse here, or a zombie's offsets would count.
        if under.generation_id < 0 or (current.generation_id, current.member_id) != (under.generation_id,
                                                                                     under.member_id):
            self._fence(f"generation {under.generation_id} is over (now {current.generation_id})")
        return under

    def _offsets(self, chosen: dict[KafkaTP, int] | None = None) -> dict[KafkaTP, OffsetAndMetadata]:
        return {tp: OffsetAndMetadata(offset, "", -1) for tp, offset in (self._positions if chosen is None else chosen).items()}

    def commit(self) -> None:
        if not self._positions and not self._stale:
            return
        self._membership()
        try:
            self._consumer.commit(self._offsets(), timeout_ms=int(self._timeout_s * 1000))
        except FENCING_ERRORS as exc:
            self._fence(repr(exc), exc)
        self._positions = {}

    def commit_with(self, outputs: Sequence[tuple[str, Message]], *,
                    offsets: Mapping[TopicPartition, int] | None = None,
                    on_committed: Callable[[], None] | None = None) -> None:
        chosen = None if offsets is None else {KafkaTP(t, p): o for (t, p), o in offsets.items()}
        if not outputs and not (self._positions if chosen is None else chosen) and not self._stale:
            return
        membership = self._membership()
        producer = self._transactional_producer()
        commit_asked = False
        try:
            producer.begin_transaction()
            futures = [producer.send(topic, key=m.key.encode(), value=bytes(m.value),
                                     partition=self._log.place(topic, m)) for topic, m in outputs]
            if self._positions if chosen is None else chosen:
                offsets_in = producer._transaction_manager.send_offsets_to_transaction(  # noqa: SLF001
                    self._offsets(chosen), membership)
                producer._sender.wakeup()  # noqa: SLF001 - with no record sent, nothing else wakes it
                # The offsets must be in the transaction before the commit is asked for. Asked
                # at once, kafka-python could send the EndTxn while the offsets' commit was
                # still unanswered (seen during a node's failover): the outputs then committed
                # without the positions, and their inputs were read, and decided, again.
                if not offsets_in.wait(timeout_ms=self._timeout_s * 1000):
                    raise kerr.KafkaTimeoutError(f"offsets of {self.member_id} not added in {self._timeout_s}s")
            # The records need not be awaited first: the client sends the EndTxn only after
            # they are written, and not at all once one of them failed.
            commit_asked = True
            run_txn_step(producer, "begin_commit", timeout_s=self._timeout_s)
            written = [future.get(timeout=self._timeout_s) for future in futures]
        except BaseException as exc:
            self._abort(producer, exc, commit_asked=commit_asked)
            if isinstance(exc, FENCING_ERRORS):
                self._fence(repr(exc), exc)
            if isinstance(exc, kerr.KafkaError):
                raise EventLogError(f"commit_with of {self.member_id} failed and was aborted: {exc!r}") from exc
            raise
        self._positions = {} if chosen is None else {
            tp: pos for tp, pos in self._positions.items() if pos > chosen.get(tp, -1)}
        if on_committed is not None:
            on_committed()
        self._await_visible(written)

    def _await_visible(self, written) -> None:
        """Waits until `read_committed` readers see the outputs, so a reader that starts
        after `commit_with` returns finds them. Commit markers are written after the
        broker answers the commit, usually within milliseconds."""
        last: dict[KafkaTP, int] = {}
        for meta in written:
            last[meta.topic_partition] = max(meta.offset, last.get(meta.topic_partition, -1))
        deadline = time.monotonic() + self._timeout_s
        while last:
            try:
                ends = self._consumer.end_offsets(list(last), timeout_ms=int(self._timeout_s * 1000))
            except KeyError:
                # kafka-python leaves out partitions of topics this consumer writes but has not
                # looked up yet (and starts the lookup): ask again.
                ends = {}
            last = {tp: offset for tp, offset in last.items() if ends.get(tp, -1) <= offset}
            if last and time.monotonic() >= deadline:
                logger.warning("outputs of %s committed but not yet visible after %ss: %s",
                               self.member_id, self._timeout_s, sorted(last))
                return
            if last:
                time.sleep(0.001)  # a list-offsets round trip apart: markers usually land within 1-2 ms

    def _transactional_producer(self) -> KafkaProducer:
        if self._producer is None:
            producer = open_client(KafkaProducer, **self._log.producer_config(
                client_id=f"{self._consumer.config['client_id']}-txn",
                transactional_id=f"{self._group}-{self.member_id}",
                # A transaction begun within milliseconds of the last one's commit often meets
                # CONCURRENT_TRANSACTIONS while the coordinator writes the last one's markers.
                # kafka-python sleeps its whole retry backoff before sending again (its shorter
                # backoff for that case never reaches the sender), so 100 ms stalls were 10% of
                # back-to-back transactions. The markers take a few ms: retry that soon.
                retry_backoff_ms=TXN_RETRY_BACKOFF_MS))
            try:
                # Fences any older producer with this id and aborts what it left open.
                producer.init_transactions()
            except BaseException:
                producer.close(timeout=0)
                raise
            self._producer = producer
        return self._producer

    def _abort(self, producer: KafkaProducer, cause: BaseException, *, commit_asked: bool) -> None:
        """Ends a unit that failed. Once its commit was asked for, or the broker stopped
        answering, its outcome is unknown here: a commit whose answer was lost may have gone
        through, and an open transaction holding offsets keeps them from being read until it
        times out. Then the producer is dropped, and the next one's `init_transactions` (same
        transactional id), run before any committed position is read again (`_resolve_unit`),
        aborts the transaction or waits until its commit is complete, markers written. A
        unit that failed before its commit was asked for is aborted in place."""
        if isinstance(cause, ZOMBIE_ERRORS):
            self._zombie = True
        if (commit_asked or isinstance(cause, UNREACHABLE_ERRORS)) and not self._zombie:
            self._unresolved = True
            self.drop_producer(f"after {cause!r}")
            return
        try:
            run_txn_step(producer, "begin_abort", timeout_s=self._timeout_s)
            # kafka-python keeps offsets it could not commit for the next transaction's
            # offset commit, where they would rewind partitions this unit no longer owns.
            producer._transaction_manager._pending_txn_offset_commits.clear()  # noqa: SLF001
        except Exception as exc:
            # A producer that cannot abort is dropped; the next one's init_transactions
            # aborts the open transaction (or the zombie flag stops us from making one).
            self.drop_producer(f"after {cause!r} (abort failed: {exc!r})")

    def _resolve_unit(self) -> None:
        """Settles the transaction a failed unit may have left open or half-complete (see `_abort`)."""
        if self._unresolved and not self._zombie:
            try:
                self._transactional_producer()
            except kerr.KafkaError as exc:
                raise EventLogError(f"the last unit of {self.member_id} is not settled yet: {exc!r}") from exc
            self._unresolved = False

    def drop_producer(self, why: str) -> None:
        """Closes the transactional producer without waiting; the next unit opens a new one."""
        producer, self._producer = self._producer, None
        if producer is not None:
            logger.info("dropping transactional producer of %s %s", self.member_id, why)
            try:
                producer.close(timeout=0)
            except Exception as exc:  # closing a producer cut off from its broker: nothing to keep
                logger.info("closing the dropped producer of %s failed: %r", self.member_id, exc)

    def _fence(self, why: str, cause: BaseException | None = None) -> None:
        try:
            self.seek_to_committed()
        except (kerr.KafkaError, EventLogError) as exc:
            logger.info("seek after fencing %s failed: %r; the next poll rejoins", self.member_id, exc)
        raise Fenced(f"{self.member_id} in {self._group!r}: {why}; nothing was committed") from cause

    def position(self, topic: str, partition: int) -> int | None:
        try:  # known locally once fetched: poll moves it past markers too
            return self._consumer.position(KafkaTP(topic, partition), timeout_ms=int(self._timeout_s * 1000))
        except Exception:  # not assigned (any more), or no answer: the caller reads instead
            return None

    def committed(self, topic: str, partition: int) -> int | None:
        self._resolve_unit()
        return self._consumer.committed(KafkaTP(topic, partition), timeout_ms=int(self._timeout_s * 1000))

    def committed_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        found = self._fetch_committed([KafkaTP(t, p) for t, p in partitions])
        return {(tp.topic, tp.partition): offset for tp, offset in found.items()}

    def _fetch_committed(self, partitions: list[KafkaTP]) -> dict[KafkaTP, int | None]:
        """One OffsetFetch for all of them: kafka-python's `committed` asks per partition,
        its coordinator's `fetch_committed_offsets` (which `committed` calls) for a list."""
        self._resolve_unit()
        found = self._consumer._coordinator.fetch_committed_offsets(  # noqa: SLF001
            partitions, timeout_ms=int(self._timeout_s * 1000)) if partitions else {}
        return {tp: found[tp].offset if tp in found else None for tp in partitions}

    def seek_to_committed(self) -> None:
        self._stale = False
        self._positions = {}
        self._polled_under = None
        for tp, offset in self._fetch_committed(list(self._consumer.assignment())).items():
            if offset is None:
                self._consumer.seek_to_beginning(tp)
            else:
                self._consumer.seek(tp, offset)

    def assignment(self) -> set[TopicPartition]:
        return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        producer, self._producer = self._producer, None
        try:
            close_all([*([lambda: producer.close(timeout=self._timeout_s)] if producer else []),
                       lambda: self._consumer.close(autocommit=False, timeout_ms=int(self._timeout_s * 1000))])
        finally:
            self._on_close(self)
