#!/usr/bin/env bash
# Prometheus for the platform's metrics and the rules of infra/prometheus/rules.yml:
# infra/prometheus.sh up|down|status on http://127.0.0.1:19090, from Debian's `prometheus`
# package (which brings promtool). It scrapes, on loopback only, the targets listed in
# .local/prometheus/targets/*.json (file_sd, re-read as they change); `up` writes
# ledgerlm.json there once, naming the ports below, so a platform started by hand with
# those ports is scraped: the API on LEDGERLM_API_PORT (8000), and each other process on
# the LEDGERLM_METRICS_PORT given here. Edit the file, or add one, for other ports.
# Data (one day) in .local/prometheus/data, log in .local/logs/prometheus.log.
set -euo pipefail
SERVICE=prometheus
source "$(dirname "$0")/lib.sh"

PORT=19090
DIR="$LOCAL/prometheus"
CONFIG="$DIR/prometheus.yml"
TARGETS="$DIR/targets"
PIDFILE="$RUN/prometheus.pid"
LOG="$LOGS/prometheus.log"
RULES="$ROOT/infra/prometheus"

live() { curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/-/ready"; }
healthy() { alive "$PIDFILE" "$CONFIG" && live; }

install() {
  command -v prometheus >/dev/null && command -v promtool >/dev/null && return 0
  command -v curl >/dev/null || apt_install curl ca-certificates
  apt_install prometheus
  command -v prometheus >/dev/null && command -v promtool >/dev/null \
    || die "prometheus or promtool still missing after apt-get install prometheus"
}

write_config() {
  mkdir -p "$TARGETS" "$DIR/data"
  cat >"$CONFIG.tmp" <<EOF
# Written by infra/prometheus.sh up; edit that script, not this file.
global:
  scrape_interval: 5s
  scrape_timeout: 4s
  evaluation_interval: 5s
rule_files:
  - $RULES/rules.yml
scrape_configs:
  - job_name: ledgerlm
    file_sd_configs:
      - files: ["$TARGETS/*.json"]
        refresh_interval: 5s
    relabel_configs:
      # Loopback only: /metrics is unauthenticated and names tenants.
      - source_labels: [__address__]
        regex: '(127\.0\.0\.1|localhost|\[::1\]):\d+'
        action: keep
EOF
  mv -f "$CONFIG.tmp" "$CONFIG"
  [ -f "$TARGETS/ledgerlm.json" ] || cat >"$TARGETS/ledgerlm.json" <<'EOF'
[
  {"targets": ["127.0.0.1:8000"], "labels": {"process": "api"}},
  {"targets": ["127.0.0.1:9401"], "labels": {"process": "admission"}},
  {"targets": ["127.0.0.1:9402"], "labels": {"process": "worker"}},
  {"targets": ["127.0.0.1:9403"], "labels": {"process": "projector"}},
  {"targets": ["127.0.0.1:9404"], "labels": {"process": "batch-dispatcher"}},
  {"targets": ["127.0.0.1:9405"], "labels": {"process": "batch-worker"}}
]
EOF
  timeout 60 promtool check config "$CONFIG" >>"$LOG" 2>&1 || { show_log "$LOG"; die "promtool rejects $(rel "$CONFIG")"; }
}

up() {
  if healthy; then
    # The rules may have changed in the checkout since it started: read them again.
    write_config
    curl -sf -o /dev/null --max-time 10 -X POST "http://127.0.0.1:$PORT/-/reload" || die "reloading the rules failed"
    say "running  http://127.0.0.1:$PORT (already up; config and rules read again)"; return 0
  fi
  local t0=$SECONDS
  install
  stop_service "$PIDFILE" "$CONFIG" "$PORT" 30
  require_free_port "$PORT"
  rotate_log "$LOG"
  write_config
  run_clean setsid nohup prometheus --config.file="$CONFIG" --storage.tsdb.path="$DIR/data" \
    --storage.tsdb.retention.time=1d --web.listen-address="127.0.0.1:$PORT" --web.enable-lifecycle \
    >>"$LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  local deadline=$((SECONDS + 60))
  until healthy; do
    running "$(cat "$PIDFILE")" || { show_log "$LOG"; die "prometheus exited during start-up"; }
    ((SECONDS < deadline)) || { show_log "$LOG"; down >/dev/null; die "prometheus not ready within 60 s"; }
    sleep 0.5
  done
  say "up       http://127.0.0.1:$PORT (targets in $(rel "$TARGETS"), ready in $(elapsed "$t0"); log $(rel "$LOG"))"
}

down() {
  stop_service "$PIDFILE" "$CONFIG" "$PORT" 30
  say "stopped"
}

status() {
  if healthy; then say "running  http://127.0.0.1:$PORT (pid $(cat "$PIDFILE"))"
  else say "stopped"; return 3; fi
}

case "${1:-}" in
  up | down | status) "$1" ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
