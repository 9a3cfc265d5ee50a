"""A replicated Kafka cluster of a test's own: three combined broker+controller KRaft nodes
(a controller quorum of three), each in its own network namespace with its own address
(`tests.broker_network`), set up as production should be (`infra/kafka-cluster.properties`):
replication factor 3, min.insync.replicas 2, no unclean leader election. The session's
shared broker is never touched.

    cluster = KafkaCluster(tmp_path / "cluster").start()
    cluster.kill(2); cluster.restart(2)        # SIGKILL, then back on the same storage
    cluster.cut(3); cluster.reconnect(3)       # off the network, then back on it
    cluster.wait_fully_replicated(); cluster.close()
"""
from __future__ import annotations

import base64
import os
import signal
import subprocess
import uuid
from pathlib import Path

from tests.broker_network import BrokerNetwork
from tests.helpers import wait_until
from tests.kafka_broker import STARTED, kafka_libs

PORT, CONTROLLER_PORT = 9092, 9093  # every node has an address of its own, so they share ports
REPLICAS, MIN_INSYNC = 3, 2
# The JVM options infra/kafka.sh gives the shared broker, with a smaller heap: three nodes
# share this machine with the platform under test.
JVM = ["-Xms128m", "-Xmx384m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true"]


class KafkaCluster:
    def __init__(self, home: Path, *, nodes: int = 3, start_s: float = 120.0):
        self.home, self.start_s = Path(home), start_s
        self.network = BrokerNetwork(nodes)
        self.nodes = self.network.nodes
        self.servers = [f"{self.network.address(n)}:{PORT}" for n in self.nodes]
        self.url = "kafka://" + ",".join(self.servers)
        self._libs = kafka_libs()
        self._procs: dict[int, subprocess.Popen] = {}

    def _dir(self, node: int) -> Path:
        return self.home / f"node{node}"

    def log(self, node: int) -> Path:
        return self._dir(node) / "server.log"

    def _write_config(self, node: int) -> Path:
        home, addr = self._dir(node), self.network.address(node)
        home.mkdir(parents=True, exist_ok=True)
        voters = ",".join(f"{n}@{self.network.address(n)}:{CONTROLLER_PORT}" for n in self.nodes)
        # Failure detection is quicker than the defaults (9 s session, 30 s replica lag) so
        # the test's outages resolve within its bound; the replication settings are production's.
        (home / "server.properties").write_text(f"""process.roles=broker,controller
node.id={node}
controller.quorum.voters={voters}
listeners=PLAINTEXT://{addr}:{PORT},CONTROLLER://{addr}:{CONTROLLER_PORT}
advertised.listeners=PLAINTEXT://{addr}:{PORT}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={home / 'data'}
num.partitions=4
auto.create.topics.enable=false
default.replication.factor={REPLICAS}
min.insync.replicas={MIN_INSYNC}
unclean.leader.election.enable=false
offsets.topic.replication.factor={REPLICAS}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={REPLICAS}
transaction.state.log.min.isr={MIN_INSYNC}
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor={REPLICAS}
share.coordinator.state.topic.min.isr={MIN_INSYNC}
group.initial.rebalance.delay.ms=0
broker.session.timeout.ms=6000
broker.heartbeat.interval.ms=1000
replica.lag.time.max.ms=8000
""")
        (home / "log4j2.properties").write_text(f"""status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {self.log(node)}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.state.name = state.change.logger
logger.state.level = WARN
""")
        return home / "server.properties"

    def _java(self, node: int, *args: str) -> list[str]:
        return [*self.network.run_in(node), "java", *JVM,
                f"-Dlog4j2.configurationFile={self._dir(node) / 'log4j2.properties'}", "-cp", f"{self._libs}/*", *args]

    def _format(self) -> None:
        # Base64url of 16 random bytes; a leading "-" would read as an option to the storage tool.
        cluster_id = "A" + base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()[1:]
        formats = {n: subprocess.Popen(self._java(n, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c",
                                                  str(self._write_config(n))),
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for n in self.nodes}
        for node, proc in formats.items():
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"formatting node {node}'s storage failed: {out}"

    def _started_count(self, node: int) -> int:
        log = self.log(node)
        return log.read_text(errors="replace").count(STARTED) if log.exists() else 0

    def _launch(self, node: int) -> int:
        assert node not in self._procs or self._procs[node].poll() is not None, f"node {node} is running"
        before = self._started_count(node)
        with (self._dir(node) / "stdout.log").open("a") as out:
            # `ip netns exec` execs java itself, so the pid is the broker's.
            self._procs[node] = subprocess.Popen(self._java(node, "kafka.Kafka", str(self._dir(node) / "server.properties")),
                                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return before

    def _wait_started(self, started_before: dict[int, int]) -> None:
        def serving() -> bool:
            for node, before in started_before.items():
                proc = self._procs[node]
                if proc.poll() is not None:
                    tail = self.log(node).read_text(errors="replace")[-3000:] if self.log(node).exists() else ""
                    raise AssertionError(f"Kafka node {node} exited with {proc.returncode}: {tail}")
            return all(self._started_count(n) > before for n, before in started_before.items())
        wait_until(serving, self.start_s, what=f"Kafka nodes {sorted(started_before)} to start", every_s=0.2)

    def start(self) -> "KafkaCluster":
        """Builds the network, formats every node's storage and starts all three together
        (a controller quorum needs two of them to elect a leader), then waits until each serves."""
        self.network.up()
        try:
            self._format()
            self._wait_started({n: self._launch(n) for n in self.nodes})
        except BaseException:
            self.close()
            raise
        return self

    def kill(self, node: int) -> None:
        """SIGKILL: the node dies at once, with whatever it had not written to disk."""
        proc = self._procs[node]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def restart(self, node: int) -> None:
        """Starts a killed node again on its own storage and waits until it serves."""
        self._wait_started({node: self._launch(node)})

    def cut(self, node: int) -> None:
        self.network.cut(node)

    def reconnect(self, node: int) -> None:
        self.network.reconnect(node)

    def check(self) -> None:
        """Fails if a node that should be running has exited."""
        gone = {n: p.returncode for n, p in self._procs.items() if p.poll() is not None}
        assert not gone, f"Kafka nodes exited: {gone}"

    def under_replicated(self, admin) -> list[str]:
        """Partitions (internal ones too) with fewer than every node in sync, as
        'topic/partition isr=[...]'; empty when the whole cluster is replicated."""
        short = []
        for topic in admin.describe_topics():
            for p in topic["partitions"]:
                if len(p["isr_nodes"]) < len(self.nodes) or p["leader_id"] < 0:
                    short.append(f"{topic['name']}/{p['partition_index']} isr={sorted(p['isr_nodes'])}")
        return short

    def wait_fully_replicated(self, timeout_s: float, *, what: str) -> None:
        """Waits until every partition of every topic has all nodes in its ISR."""
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.servers, client_id="ledgerlm-cluster-test",
                                 request_timeout_ms=5000)
        last: list[list[str]] = [[]]

        def replicated() -> bool:
            try:
                last[0] = self.under_replicated(admin)
            except Exception as exc:  # a node still finding its feet answers with an error now and then
                last[0] = [repr(exc)]
            return not last[0]
        try:
            wait_until(replicated, timeout_s, what=what, every_s=0.5)
        except AssertionError:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}: still short {last[0][:8]}") \
                from None
        finally:
            admin.close()

    def leader_of(self, admin, topic: str, partition: int) -> int:
        (info,) = admin.describe_topics([topic])
        return next(p["leader_id"] for p in info["partitions"] if p["partition_index"] == partition)

    def close(self) -> None:
        """Kills every node and takes the network down, whatever state they are in."""
        for proc in self._procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(30)
        self.network.down()

    def __enter__(self) -> "KafkaCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
