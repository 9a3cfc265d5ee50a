"""What a Kafka transaction unit would gain if its requests went out in bursts instead of
one at a time.

A unit as `commit_with` makes it is five requests, each sent only after the one before
returned: AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, Produce, EndTxn
(kafka-python 3 sends one transactional request at a time, and no produce while one is
in flight). A broker handles the requests of one connection in order, one at a time, so
a client may send several before the first returns. The safe bursts are: both "add"
requests together, then the produce with the offsets, then EndTxn once both came back
clean. (EndTxn may not join a burst: a produce that failed must abort the unit, never
commit it. Nor may the produce join the first burst: a broker can accept it while the
add request before it is refused with CONCURRENT_TRANSACTIONS.)

This probe times the same unit (one record, one input position) both ways, on the
protocol's own request classes and one connection, alternating in rounds. It measures
client and broker round trips only: no visibility wait, no platform code. Prints a
table; records nothing.

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/txn_round_trips.py [--units 300]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kafka.net.compat import KafkaNetClient  # noqa: E402
from kafka.protocol.metadata import FindCoordinatorRequest  # noqa: E402
from kafka.protocol.producer import (  # noqa: E402
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, EndTxnRequest, InitProducerIdRequest, ProduceRequest,
    TxnOffsetCommitRequest,
)
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402

from pipelines.eventlog.base import Message, TopicSpec  # noqa: E402
from pipelines.eventlog.kafka import KafkaEventLog  # noqa: E402
from tests.perf.bench_noisy_neighbour import bench_topics_cleared  # noqa: E402
from tests.perf.bench_overhead import percentile  # noqa: E402

WAYS = {"one at a time (as kafka-python)": [1, 1, 1, 1, 1], "in bursts (adds, produce + offsets, end)": [2, 2, 1]}
TRANSACTION = 1  # FindCoordinator key type


def error_codes(response) -> list[int]:
    if hasattr(response, "results_by_topic_v3_and_below"):
        return [code for _, partitions in response.results_by_topic_v3_and_below for _, code in partitions]
    if hasattr(response, "responses"):
        return [p.error_code for t in response.responses for p in t.partition_responses]
    if hasattr(response, "topics"):
        return [p.error_code for t in response.topics for p in t.partitions]
    return [response.error_code]


class Unit:
    """One transactional producer on a raw connection, writing to partition 0 of `out` and
    committing positions of partition 0 of `inputs` for `group`."""

    def __init__(self, bootstrap: str, out: str, inputs: str, group: str, group_metadata):
        self.client = KafkaNetClient(bootstrap_servers=[bootstrap], client_id="txn-round-trips")
        self.client._manager.bootstrap(10_000)
        self.node = self.client.least_loaded_node()
        self.txid, self.out, self.inputs, self.group, self.meta = f"txn-rt-{uuid.uuid4().hex[:8]}", out, inputs, group, group_metadata
        found = self.client.send_and_receive(self.node, FindCoordinatorRequest(
            key=self.txid, key_type=TRANSACTION, coordinator_keys=[self.txid]))
        if {c.node_id for c in found.coordinators} != {self.node}:
            raise SystemExit("this probe needs a single-node cluster (coordinator and leader on one connection)")
        init = self.client.send_and_receive(self.node, InitProducerIdRequest(
            transactional_id=self.txid, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1))
        self.pid, self.epoch, self.sequence = init.producer_id, init.producer_epoch, 0

    def requests(self, position: int) -> list:
        batch = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=self.pid,
                                          producer_epoch=self.epoch, base_sequence=self.sequence, batch_size=1 << 20)
        batch.append(0, timestamp=int(time.time() * 1000), key=b"k", value=b"v" * 300, headers=[])
        ids = dict(transactional_id=self.txid, producer_id=self.pid, producer_epoch=self.epoch)
        topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
        return [
            AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=self.txid, v3_and_below_producer_id=self.pid,
                v3_and_below_producer_epoch=self.epoch, max_version=3,
                v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=self.out, partitions=[0])]),
            AddOffsetsToTxnRequest(group_id=self.group, max_version=3, **ids),
            ProduceRequest(transactional_id=self.txid, acks=-1, timeout_ms=30_000, min_version=3, max_version=9,
                           topic_data=[ProduceRequest.TopicProduceData(name=self.out, partition_data=[
                               ProduceRequest.TopicProduceData.PartitionProduceData(
                                   index=0, records=bytes(batch.build()))])]),
            TxnOffsetCommitRequest(
                group_id=self.group, generation_id=self.meta.generation_id, member_id=self.meta.member_id,
                group_instance_id=self.meta.group_instance_id, max_version=3, **ids,
                topics=[topic(name=self.inputs, partitions=[topic.TxnOffsetCommitRequestPartition(
                    partition_index=0, committed_offset=position, committed_leader_epoch=-1, committed_metadata="")])]),
            EndTxnRequest(committed=True, max_version=3, **ids),
        ]

    def run(self, bursts: list[int], position: int) -> list[int]:
        """Sends the unit's requests burst by burst, each burst once the one before came back
        clean; the error codes of the first burst that failed, or [] once committed."""
        requests, sent = self.requests(position), 0
        for size in bursts:
            futures = [self.client.send(self.node, r) for r in requests[sent:sent + size]]
            for future in futures:
                self.client.poll(timeout_ms=10_000, future=future)
                if not future.succeeded():
                    raise SystemExit(f"request failed: {future.exception!r}")
            codes = [c for f in futures for c in error_codes(f.value)]
            sent += size
            if any(codes):
                return codes
        self.sequence += 1
        return []

    def abort(self) -> None:
        future = self.client.send(self.node, EndTxnRequest(
            transactional_id=self.txid, producer_id=self.pid, producer_epoch=self.epoch, committed=False,
            max_version=3))
        self.client.poll(timeout_ms=10_000, future=future)

    def timed(self, bursts: list[int], position: int) -> tuple[float, int]:
        """Milliseconds of the attempt that committed, and the attempts refused before it
        (the coordinator still completing the unit before: retried after 3 ms, as here)."""
        for refused in range(50):
            start = time.perf_counter()
            if not self.run(bursts, position):
                return (time.perf_counter() - start) * 1000, refused
            self.abort()  # whatever part of it began
            time.sleep(0.003)
        raise SystemExit("50 attempts refused in a row")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--units", type=int, default=300, help="units each way (default 300)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    url = os.environ["LEDGERLM_TEST_KAFKA"]
    bootstrap = urlsplit(url).netloc or url
    ns = f"bench{uuid.uuid4().hex[:8]}"  # the benchmarks' prefix: `bench_topics_cleared` deletes its topics
    inputs, out, group = f"{ns}-in", f"{ns}-out", f"{ns}-txn"
    with bench_topics_cleared("kafka"):
        probe(bootstrap, inputs, out, group, args)


def probe(bootstrap: str, inputs: str, out: str, group: str, args) -> None:
    log = KafkaEventLog(bootstrap)
    try:
        log.ensure_topics([TopicSpec(inputs, 1), TopicSpec(out, 1)])
        log.append(inputs, [Message(key="k", value=b"x")])
        member = log.consumer(group, [inputs])  # a live member: TxnOffsetCommit checks its generation
        deadline = time.monotonic() + 60
        while not member.poll(timeout_s=0.5):
            if time.monotonic() > deadline:
                raise SystemExit("the probe's consumer never joined its group")
        unit = Unit(bootstrap, out, inputs, group, member._consumer.group_metadata())  # noqa: SLF001
        times = {way: [] for way in WAYS}
        refused = dict.fromkeys(WAYS, 0)
        per_round = max(1, args.units // args.rounds)
        position = 1
        for _ in range(args.rounds):
            for way, bursts in WAYS.items():
                for _ in range(per_round):
                    ms, n = unit.timed(bursts, position)
                    times[way].append(ms)
                    refused[way] += n
                    position += 1
                    time.sleep(0.004)  # the coordinator's markers of the last unit, mostly
        print(f"\n{per_round * args.rounds} units each way, {args.rounds} alternating rounds, single-node Kafka "
              f"at {bootstrap}\n")
        print("| requests sent | p50 (ms) | p90 (ms) | attempts refused, retried |")
        print("|---|---:|---:|---:|")
        for way, xs in times.items():
            print(f"| {way} | {percentile(xs, 0.5):.2f} | {percentile(xs, 0.9):.2f} | {refused[way]} |")
        member.close()
    finally:
        log.close()


if __name__ == "__main__":
    main()
