#!/usr/bin/env bash
# PostgreSQL for projections and the registry: infra/postgres.sh up|down|status on
# 127.0.0.1:15432, superuser role ledgerlm/ledgerlm owning database ledgerlm (tests create
# more databases). Durability is off (fsync, synchronous_commit): this is a test server.
# Postgres refuses to run as root, so the cluster belongs to the system user `postgres`.
set -euo pipefail
SERVICE=postgres
source "$(dirname "$0")/lib.sh"

PORT=15432
OS_USER=postgres
PIDFILE="$RUN/postgres.pid"
LOG="$LOGS/postgres.log"
DATA_REF="$LOCAL/pg.path"   # where the data directory is, when not .local/pg
BIN=""

as_pg() { runuser -u "$OS_USER" -- "$@"; }

find_bin() {
  local d
  if command -v pg_ctl >/dev/null && command -v initdb >/dev/null; then
    d="$(dirname "$(readlink -f "$(command -v pg_ctl)")")"
    [ -x "$d/postgres" ] && [ -x "$d/initdb" ] && { BIN="$d"; return 0; }
  fi
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)"
  [ -n "$d" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ] && { BIN="$d"; return 0; }
  return 1
}

install() {
  find_bin && return 0
  apt_install postgresql
  find_bin || die "no pg_ctl/initdb under /usr/lib/postgresql/*/bin after apt-get"
}

ensure_user() {
  id -u "$OS_USER" >/dev/null 2>&1 && return 0
  useradd --system --no-create-home --shell /usr/sbin/nologin "$OS_USER" \
    || die "cannot create system user $OS_USER"
}

# .local/pg when the postgres user can reach it; otherwise (a checkout under a private
# home) a folder under /var/tmp named after the checkout, recorded in .local/pg.path.
data_dir() {
  if [ -s "$DATA_REF" ]; then cat "$DATA_REF"; return; fi
  chmod o+x "$LOCAL"
  if runuser -u "$OS_USER" -- test -x "$LOCAL"; then
    echo "$LOCAL/pg"
  else
    local d
    d="/var/tmp/ledgerlm-pg-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
    echo "$d" >"$DATA_REF"
    echo "$d"
  fi
}

healthy() {
  alive "$PIDFILE" postgres && port_open 127.0.0.1 "$PORT" \
    && { [ ! -x "$BIN/pg_isready" ] || "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 2; }
}

# initdb with the ledgerlm superuser, then the ledgerlm database in single-user mode,
# so no client program is needed. The .ledgerlm-ready marker means both steps finished.
init_cluster() {
  local data=$1 pw
  [ -f "$data/.ledgerlm-ready" ] && return 0
  say "initialising a cluster in $data"
  rm -rf "$data"
  mkdir -p "$data"
  chown "$OS_USER": "$data"
  chmod 700 "$data"
  pw="$(mktemp)"
  echo ledgerlm >"$pw"
  chown "$OS_USER" "$pw"
  as_pg timeout 120 "$BIN/initdb" -D "$data" -U ledgerlm --pwfile="$pw" \
    --auth-host=scram-sha-256 --auth-local=peer -E UTF8 --locale=C.UTF-8 \
    >>"$LOG" 2>&1 || { rm -f "$pw"; show_log "$LOG"; die "initdb failed"; }
  rm -f "$pw"
  cat >>"$data/postgresql.conf" <<EOF
# ledgerlm test server (infra/postgres.sh)
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = ''
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 128MB
EOF
  echo "CREATE DATABASE ledgerlm OWNER ledgerlm" \
    | as_pg timeout 60 "$BIN/postgres" --single -D "$data" postgres >>"$LOG" 2>&1 \
    || { show_log "$LOG"; die "could not create database ledgerlm"; }
  touch "$data/.ledgerlm-ready"
}

up() {
  find_bin || true
  if [ -n "$BIN" ] && healthy; then
    say "running  127.0.0.1:$PORT (already up, nothing to do)"; return 0
  fi
  local t0=$SECONDS data
  install
  ensure_user
  stop_service "$PIDFILE" postgres "$PORT" 30
  require_free_port "$PORT"
  data="$(data_dir)"
  if [ "${data#"$LOCAL"/}" = "$data" ]; then
    # The server writes its own log, so it must sit where the postgres user can reach.
    ln -sfn "$data.log" "$LOG"
    LOG="$data.log"
  fi
  rotate_log "$LOG"
  chown "$OS_USER" "$LOG"
  init_cluster "$data"
  (run_clean runuser -u "$OS_USER" -- timeout 90 "$BIN/pg_ctl" -D "$data" -l "$LOG" -w -t 60 start >/dev/null) \
    || { show_log "$LOG"; die "pg_ctl start failed or took over 60 s"; }
  head -n1 "$data/postmaster.pid" >"$PIDFILE"
  wait_for 30 healthy || { show_log "$LOG"; down >/dev/null; die "not accepting connections on $PORT"; }
  say "up       127.0.0.1:$PORT (ready in $(elapsed "$t0"); log $(rel "$LOG"))"
}

down() {
  local data
  find_bin || true
  data="$(cat "$DATA_REF" 2>/dev/null || echo "$LOCAL/pg")"
  if [ -n "$BIN" ] && [ -f "$data/postmaster.pid" ]; then
    as_pg timeout 45 "$BIN/pg_ctl" -D "$data" -m fast -w -t 30 stop >/dev/null 2>&1 || true
  fi
  stop_service "$PIDFILE" postgres "$PORT" 30
  say "stopped"
}

status() {
  find_bin || true
  if [ -n "$BIN" ] && healthy; then say "running  127.0.0.1:$PORT (pid $(cat "$PIDFILE"))"
  else say "stopped"; return 3; fi
}

case "${1:-}" in
  up | down | status) "$1" ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
