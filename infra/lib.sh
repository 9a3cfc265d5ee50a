# Shared helpers for the service scripts (sourced, not run): paths under .local/,
# bounded waits, pid-file process control and a guarded apt-get.
# Every wait here has a deadline so that no script can hang a CI run.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="${LEDGERLM_LOCAL:-$ROOT/.local}"
LOGS="$LOCAL/logs"
RUN="$LOCAL/run"
mkdir -p "$LOGS" "$RUN"

say() { printf '%-9s %s\n' "${SERVICE:-services}" "$*"; }
die() { say "FAILED: $*" >&2; exit 1; }
rel() { printf '%s' "${1#"$ROOT"/}"; }

# Prints the last lines of a log and where it is, for a failed start or install.
show_log() {
  say "see $(rel "$1"); its last lines:" >&2
  tail -n "${2:-25}" "$1" 2>/dev/null | sed 's/^/    /' >&2 || true
}

# wait_for SECONDS CMD...: polls CMD until it succeeds; returns 1 at the deadline.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5
  done
}

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }

# alive PIDFILE PATTERN: the recorded process exists and its command line matches,
# so a recycled pid never passes for our server.
alive() {
  local pid
  pid="$(cat "$1" 2>/dev/null)" || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$2"
}

# running PID: the process exists and is not a zombie (a child of ours that died stays one,
# since nothing waits for it, and kill -0 still succeeds on it).
running() {
  local state
  state="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
  [[ "$state" != Z* ]]
}

# listener_pid PORT: pid of whatever listens on 127.0.0.1:PORT (empty if none).
listener_pid() {
  { ss -ltnpH "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2; } || true
}

# stop_pid PID SECONDS: TERM, wait up to SECONDS, then KILL.
stop_pid() {
  local pid=$1
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_for "$2" bash -c "! kill -0 $pid"; then
    say "pid $pid ignored TERM for $2 s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    wait_for 10 bash -c "! kill -0 $pid" || die "pid $pid survived SIGKILL"
  fi
}

# stop_service PIDFILE PATTERN PORT SECONDS: stops our process by its pid file, and also
# one still listening on our port whose command matches (e.g. after .local was wiped).
stop_service() {
  local pidfile=$1 pattern=$2 port=$3 grace=$4 pid
  if alive "$pidfile" "$pattern"; then stop_pid "$(cat "$pidfile")" "$grace"; fi
  rm -f "$pidfile"
  pid="$(listener_pid "$port")"
  if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$pattern"; then
    say "stopping stray pid $pid on port $port"
    stop_pid "$pid" "$grace"
  fi
}

# The port must be free before we start, or a foreign server would answer our health check.
require_free_port() {
  local pid
  port_open 127.0.0.1 "$1" || return 0
  pid="$(listener_pid "$1")"
  die "port $1 is taken by pid ${pid:-?} ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-80))"
}

# run_clean CMD...: execs CMD with only stdin, stdout and stderr open, so a server that
# outlives us holds no pipe or lock of our caller's (a CI pipeline would wait on it forever).
# It replaces the calling shell: use it in `( ... )` or with `&` (then $! is CMD's pid).
run_clean() {
  local fd
  for fd in $(ls "/proc/$BASHPID/fd"); do
    if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
  done
  exec "$@"
}

# Keep the previous run's log as NAME.1 so a health check only reads this run's lines.
rotate_log() { [ -f "$1" ] && mv -f "$1" "$1.1"; : >"$1"; }

# apt_install PKG...: apt-get update once per machine-day, with service start-up disabled
# during the install (Debian's postinst would otherwise start a second server on the
# default port) and a bounded wait for the dpkg lock.
apt_install() {
  command -v apt-get >/dev/null || die "apt-get is missing; install $* by hand"
  local log="$LOGS/apt.log" stamp="$RUN/apt-updated" policy=/usr/sbin/policy-rc.d made_policy=""
  say "installing $* with apt-get (log: $(rel "$log"))"
  if [ ! -f "$stamp" ] || [ -n "$(find "$stamp" -mmin +720)" ]; then
    timeout 300 apt-get -o DPkg::Lock::Timeout=120 update -q >>"$log" 2>&1 \
      || { show_log "$log"; die "apt-get update failed"; }
    touch "$stamp"
  fi
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
  fi
  local rc=0
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get -o DPkg::Lock::Timeout=120 \
    install -y -q --no-install-recommends "$@" >>"$log" 2>&1 || rc=$?
  [ -z "$made_policy" ] || rm -f "$policy"
  [ "$rc" = 0 ] || { show_log "$log"; die "apt-get install $* failed (exit $rc)"; }
}

# elapsed START: whole seconds since START (a $SECONDS value).
elapsed() { echo "$((SECONDS - $1))s"; }
