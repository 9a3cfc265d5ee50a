"""A Kafka broker of a test's own (single-node KRaft, as `infra/kafka.sh` runs the shared one),
on free ports, its storage under the test's directory: for tests that freeze, stop or
restart the broker, which the session's shared broker must never be.

    broker = DedicatedBroker(tmp_path / "kafka").start()
    broker.freeze(); broker.thaw(); broker.stop(); broker.start(); broker.close()
"""
from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import uuid
from pathlib import Path

from tests.helpers import ROOT, wait_until

KAFKA_HOME = ROOT / ".local" / "kafka"
STARTED = "Kafka Server started"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kafka_libs() -> Path:
    libs = sorted(p for p in KAFKA_HOME.glob("libs-*") if (p / ".complete").exists())
    if not libs:
        raise AssertionError(f"no Kafka installed under {KAFKA_HOME}: run `infra/services.sh up kafka`")
    return libs[-1]


class DedicatedBroker:
    def __init__(self, home: Path, *, start_s: float = 90.0):
        self.home, self.start_s = Path(home), start_s
        self.port, self.controller_port = _free_port(), _free_port()
        self.url = f"kafka://127.0.0.1:{self.port}"
        self._libs = kafka_libs()
        self._proc: subprocess.Popen | None = None
        self.home.mkdir(parents=True, exist_ok=True)
        self.config = self.home / "server.properties"
        self.log = self.home / "server.log"
        self._write_config()
        self._format()

    def _write_config(self) -> None:
        self.config.write_text(f"""process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{self.controller_port}
listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={self.home / 'data'}
num.partitions=4
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
default.replication.factor=1
min.insync.replicas=1
group.initial.rebalance.delay.ms=0
""")
        (self.home / "log4j2.properties").write_text(f"""status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {self.log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
""")

    def _java(self, *args: str) -> list[str]:
        return ["java", "-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}", "-cp", f"{self._libs}/*", *args]

    def _format(self) -> None:
        # Base64url of 16 random bytes; a leading "-" would read as an option to the storage tool.
        cluster_id = "A" + base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()[1:]
        done = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c",
                                         str(self.config)), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"formatting the broker's storage failed: {done.stdout}{done.stderr}"

    def _started_count(self) -> int:
        return self.log.read_text(errors="replace").count(STARTED) if self.log.exists() else 0

    def start(self) -> "DedicatedBroker":
        """Starts the broker on its storage (again, after `stop`) and waits until it serves."""
        assert self._proc is None or self._proc.poll() is not None, "the broker is running"
        before = self._started_count()
        with (self.home / "stdout.log").open("a") as out:
            self._proc = subprocess.Popen(self._java("kafka.Kafka", str(self.config)), stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True)

        def serving() -> bool:
            if self._proc.poll() is not None:
                raise AssertionError(f"the dedicated broker exited with {self._proc.returncode}: "
                                     f"{self.log.read_text(errors='replace')[-3000:] if self.log.exists() else ''}")
            return self._started_count() > before
        wait_until(serving, self.start_s, what="the dedicated Kafka broker to start", every_s=0.2)
        return self

    def freeze(self) -> None:
        """SIGSTOP: the broker holds its connections and answers nothing (a long pause)."""
        os.killpg(self._proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self._proc.pid, signal.SIGCONT)

    def stop(self, timeout_s: float = 60.0) -> None:
        """A clean shutdown (SIGTERM), waited for; SIGKILL if it takes longer."""
        if self._proc is None or self._proc.poll() is not None:
            return
        os.killpg(self._proc.pid, signal.SIGCONT)  # a frozen broker cannot shut down
        os.killpg(self._proc.pid, signal.SIGTERM)
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(10)

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
