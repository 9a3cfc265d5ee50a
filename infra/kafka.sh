#!/usr/bin/env bash
# Apache Kafka (KRaft, one combined broker+controller node) for the event log:
# infra/kafka.sh up|down|status, clients on 127.0.0.1:19092, controller on 127.0.0.1:19093.
# Kafka is on neither Debian nor PyPI, so the broker jars come from Maven Central
# (org.apache.kafka:kafka_2.13 and its runtime dependencies) into .local/kafka/libs-VERSION,
# with Maven's own cache in .local/m2.
set -euo pipefail
SERVICE=kafka
source "$(dirname "$0")/lib.sh"

VERSION="${LEDGERLM_KAFKA_VERSION:-4.3.1}"
PORT=19092
CONTROLLER_PORT=19093
HOME_DIR="$LOCAL/kafka"
LIBS="$HOME_DIR/libs-$VERSION"
DATA="$HOME_DIR/data"
PIDFILE="$RUN/kafka.pid"
LOG="$LOGS/kafka.log"
STDOUT_LOG="$LOGS/kafka.stdout.log"
INSTALL_LOG="$LOGS/kafka-install.log"
MAIN=kafka.Kafka

# Matching the jar folder too means a changed VERSION counts as not running.
healthy() {
  alive "$PIDFILE" "$LIBS/" && port_open 127.0.0.1 "$PORT" \
    && grep -q "Kafka Server started" "$LOG"
}

install() {
  [ -f "$LIBS/.complete" ] && return 0
  if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
    apt_install openjdk-17-jre-headless maven
  fi
  say "fetching Kafka $VERSION jars with Maven (log: $(rel "$INSTALL_LOG"))"
  mkdir -p "$HOME_DIR"
  rm -rf "$HOME_DIR"/libs-*   # another version's jars: only one is ever run
  # slf4j 2 plus log4j's slf4j2 binding: without them the broker logs nowhere.
  cat >"$HOME_DIR/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.ledgerlm</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>2.0.17</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>2.25.5</version></dependency>
  </dependencies>
</project>
EOF
  timeout 600 mvn -B -q -f "$HOME_DIR/pom.xml" -Dmaven.repo.local="$LOCAL/m2" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIBS" \
    >"$INSTALL_LOG" 2>&1 || { show_log "$INSTALL_LOG"; die "Maven could not fetch Kafka $VERSION"; }
  [ -f "$LIBS/kafka_2.13-$VERSION.jar" ] || die "kafka_2.13-$VERSION.jar missing from $(rel "$LIBS")"
  touch "$LIBS/.complete"
}

write_config() {
  mkdir -p "$DATA"
  cat >"$HOME_DIR/server.properties" <<EOF
# Written by infra/kafka.sh; edits are overwritten on the next start.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DATA
num.partitions=4
auto.create.topics.enable=false
# One node: internal topics and transactions must not wait for replicas that never come.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
default.replication.factor=1
min.insync.replicas=1
group.initial.rebalance.delay.ms=0
EOF
  cat >"$HOME_DIR/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $LOG
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.state.name = state.change.logger
logger.state.level = WARN
EOF
}

# Storage is formatted once per Kafka version: an older broker refuses a log directory
# formatted by a newer one, and this is disposable test data.
format_storage() {
  if [ -f "$DATA/meta.properties" ] && [ "$(cat "$DATA/.formatted-by" 2>/dev/null)" = "$VERSION" ]; then
    return 0
  fi
  rm -rf "$DATA"
  mkdir -p "$DATA"
  local id
  id="$(timeout 60 java -cp "$LIBS/*" kafka.tools.StorageTool random-uuid 2>>"$INSTALL_LOG" | tail -n1)"
  [ -n "$id" ] || { show_log "$INSTALL_LOG"; die "StorageTool random-uuid failed"; }
  timeout 90 java -Dlog4j2.configurationFile="$HOME_DIR/log4j2.properties" -cp "$LIBS/*" \
    kafka.tools.StorageTool format -t "$id" -c "$HOME_DIR/server.properties" \
    >>"$INSTALL_LOG" 2>&1 || { show_log "$INSTALL_LOG"; die "StorageTool format failed"; }
  echo "$VERSION" >"$DATA/.formatted-by"
}

up() {
  if healthy; then say "running  127.0.0.1:$PORT (already up, nothing to do)"; return 0; fi
  local t0=$SECONDS
  install
  stop_service "$PIDFILE" "$MAIN" "$PORT" 60
  require_free_port "$PORT"
  require_free_port "$CONTROLLER_PORT"
  write_config
  format_storage
  rotate_log "$LOG"
  # setsid: the broker outlives this script and its terminal's signals.
  run_clean setsid nohup java -Xms256m -Xmx768m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$HOME_DIR/log4j2.properties" \
    -cp "$LIBS/*" "$MAIN" "$HOME_DIR/server.properties" \
    >"$STDOUT_LOG" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$PIDFILE"
  local deadline=$((SECONDS + 90))
  until healthy; do
    running "$pid" || { show_log "$LOG"; show_log "$STDOUT_LOG" 10; die "broker exited during start-up"; }
    ((SECONDS < deadline)) || { show_log "$LOG"; down >/dev/null; die "broker not started within 90 s"; }
    sleep 0.5
  done
  say "up       127.0.0.1:$PORT (Kafka $VERSION, ready in $(elapsed "$t0"); log $(rel "$LOG"))"
}

down() {
  stop_service "$PIDFILE" "$MAIN" "$PORT" 60
  say "stopped"
}

status() {
  if healthy; then say "running  127.0.0.1:$PORT (Kafka $VERSION, pid $(cat "$PIDFILE"))"
  else say "stopped"; return 3; fi
}

case "${1:-}" in
  up | down | status) "$1" ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
