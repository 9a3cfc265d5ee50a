#!/usr/bin/env bash
# A real S3-compatible server for Parquet output: infra/s3.sh up|down|status on
# http://127.0.0.1:19000, key ledgerlm / secret ledgerlm-secret, bucket ledgerlm-test.
# MinIO by default; LEDGERLM_S3_SERVER=versitygw picks the Versity S3 gateway (Apache-2.0,
# POSIX backend, builds in about half the time). Neither ships as a binary through a
# package registry we can reach, so each is built from the Go module proxy, pinned, into
# .local/bin; the Go caches are removed after a good build (about 2 GB for MinIO).
set -euo pipefail
SERVICE=s3
source "$(dirname "$0")/lib.sh"

SERVER="${LEDGERLM_S3_SERVER:-minio}"
PORT=19000
KEY=ledgerlm
SECRET=ledgerlm-secret
BUCKET=ledgerlm-test
PIDFILE="$RUN/s3.pid"
LOG="$LOGS/s3.log"
BUILD_LOG="$LOGS/s3-build.log"
case "$SERVER" in
  minio)
    MODULE=github.com/minio/minio
    VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
    HEALTH=/minio/health/live ;;
  versitygw)
    MODULE=github.com/versity/versitygw/cmd/versitygw
    VERSION=v1.8.0
    HEALTH=/health ;;
  *) echo "LEDGERLM_S3_SERVER must be minio or versitygw, not '$SERVER'" >&2; exit 2 ;;
esac
BIN="$LOCAL/bin/$SERVER-$VERSION"
DATA="$LOCAL/$SERVER/data"
# Any server binary we built; matches a running one whichever SERVER is chosen now.
PATTERN="$LOCAL/bin/"

live() { curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$PORT$HEALTH"; }
healthy() { alive "$PIDFILE" "$BIN" && live; }

s3_curl() {
  curl -s --max-time 10 --aws-sigv4 "aws:amz:us-east-1:s3" --user "$KEY:$SECRET" "$@"
}

install() {
  [ -x "$BIN" ] && return 0
  command -v curl >/dev/null || apt_install curl ca-certificates
  local go gobuild="$LOCAL/go"
  go="$(command -v go || echo /usr/local/go/bin/go)"
  [ -x "$go" ] || die "no Go toolchain (need Go >= 1.24 on PATH or at /usr/local/go/bin/go)"
  say "building $SERVER $VERSION with $("$go" env GOVERSION) (log: $(rel "$BUILD_LOG"); a few minutes)"
  local t0=$SECONDS
  (
    export GOPATH="$gobuild" GOMODCACHE="$gobuild/mod" GOCACHE="$gobuild/cache" \
      GOBIN="$gobuild/bin" GOFLAGS=-mod=mod CGO_ENABLED=0
    timeout 1200 "$go" install "$MODULE@$VERSION"
  ) >"$BUILD_LOG" 2>&1 || { show_log "$BUILD_LOG"; die "go install $MODULE@$VERSION failed"; }
  mkdir -p "$LOCAL/bin"
  mv -f "$gobuild/bin/$(basename "$MODULE")" "$BIN"
  GOPATH="$gobuild" GOMODCACHE="$gobuild/mod" GOCACHE="$gobuild/cache" \
    timeout 300 "$go" clean -cache -modcache >>"$BUILD_LOG" 2>&1 || true
  rm -rf "$gobuild"
  say "built $SERVER in $(elapsed "$t0")"
}

start_server() {
  case "$SERVER" in
    minio)
      MINIO_ROOT_USER="$KEY" MINIO_ROOT_PASSWORD="$SECRET" MINIO_BROWSER=off \
        MINIO_UPDATE=off MINIO_CI_CD=1 \
        run_clean setsid nohup "$BIN" server --quiet --address "127.0.0.1:$PORT" \
        --console-address 127.0.0.1:19001 "$DATA" >"$LOG" 2>&1 </dev/null & ;;
    versitygw)
      ROOT_ACCESS_KEY_ID="$KEY" ROOT_SECRET_ACCESS_KEY="$SECRET" \
        run_clean setsid nohup "$BIN" --port "127.0.0.1:$PORT" --health "$HEALTH" \
        posix "$DATA" >"$LOG" 2>&1 </dev/null & ;;
  esac
  echo $! >"$PIDFILE"
}

# PUT bucket answers 200 when made and 409 when it exists; HEAD then proves it is ours.
ensure_bucket() {
  local code
  code="$(s3_curl -o "$RUN/s3-put.out" -w '%{http_code}' -X PUT "http://127.0.0.1:$PORT/$BUCKET")" || true
  case "$code" in 200 | 409) ;; *) cat "$RUN/s3-put.out" >>"$LOG"; die "PUT bucket $BUCKET answered '$code' (see $(rel "$LOG"))" ;; esac
  code="$(s3_curl -o /dev/null -w '%{http_code}' -I "http://127.0.0.1:$PORT/$BUCKET")" || true
  [ "$code" = 200 ] || die "HEAD bucket $BUCKET answered '$code'"
}

up() {
  if healthy; then ensure_bucket; say "running  http://127.0.0.1:$PORT ($SERVER, already up, nothing to do)"; return 0; fi
  local t0=$SECONDS
  install
  stop_service "$PIDFILE" "$PATTERN" "$PORT" 30
  require_free_port "$PORT"
  mkdir -p "$DATA"
  start_server
  local deadline=$((SECONDS + 60))
  until healthy; do
    running "$(cat "$PIDFILE")" || { show_log "$LOG"; die "$SERVER exited during start-up"; }
    ((SECONDS < deadline)) || { show_log "$LOG"; down >/dev/null; die "$SERVER not live within 60 s"; }
    sleep 0.5
  done
  ensure_bucket
  say "up       http://127.0.0.1:$PORT ($SERVER, bucket $BUCKET, ready in $(elapsed "$t0"); log $(rel "$LOG"))"
}

down() {
  stop_service "$PIDFILE" "$PATTERN" "$PORT" 30
  say "stopped"
}

status() {
  if healthy; then say "running  http://127.0.0.1:$PORT ($SERVER, pid $(cat "$PIDFILE"))"
  else say "stopped"; return 3; fi
}

case "${1:-}" in
  up | down | status) "$1" ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
