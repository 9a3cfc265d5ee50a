#!/usr/bin/env bash
# Redis for the Celery batch queue: infra/redis.sh up|down|status on 127.0.0.1:16379.
# Data in .local/redis (no persistence: a test broker), log in .local/logs/redis.log.
set -euo pipefail
SERVICE=redis
source "$(dirname "$0")/lib.sh"

PORT=16379
DIR="$LOCAL/redis"
PIDFILE="$RUN/redis.pid"
LOG="$LOGS/redis.log"

# PING over a raw socket, so the check needs no client; a subshell keeps fd 3 local.
pong() (
  exec 3<>"/dev/tcp/127.0.0.1/$PORT" || exit 1
  printf 'PING\r\n' >&3
  line=""
  read -r -t 2 line <&3 || true
  [[ "$line" == +PONG* ]]
)
healthy() { alive "$PIDFILE" redis-server && pong 2>/dev/null; }

install() {
  command -v redis-server >/dev/null && return 0
  apt_install redis-server
  command -v redis-server >/dev/null || die "redis-server still missing after apt-get"
}

up() {
  if healthy; then say "running  127.0.0.1:$PORT (already up, nothing to do)"; return 0; fi
  local t0=$SECONDS
  install
  stop_service "$PIDFILE" redis-server "$PORT" 10
  require_free_port "$PORT"
  mkdir -p "$DIR"
  rotate_log "$LOG"
  (run_clean redis-server --port "$PORT" --bind 127.0.0.1 --daemonize yes --dir "$DIR" \
    --pidfile "$PIDFILE" --logfile "$LOG" --save '' --appendonly no) \
    || { show_log "$LOG"; die "redis-server did not start"; }
  wait_for 60 healthy || { show_log "$LOG"; down >/dev/null; die "no PONG on 127.0.0.1:$PORT within 60 s"; }
  say "up       127.0.0.1:$PORT (ready in $(elapsed "$t0"); log $(rel "$LOG"))"
}

down() {
  stop_service "$PIDFILE" redis-server "$PORT" 15
  say "stopped"
}

status() {
  if healthy; then say "running  127.0.0.1:$PORT (pid $(cat "$PIDFILE"))"
  else say "stopped"; return 3; fi
}

case "${1:-}" in
  up | down | status) "$1" ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
