#!/usr/bin/env bash
# The local services the integration tests use, installed and run from .local/:
#   infra/services.sh up|down|status [kafka postgres redis s3 prometheus ...]   (all five by default)
# `up` installs what is missing, starts each service and waits for it (bounded), then
# writes .local/services.env; a second `up` changes nothing. `down` leaves no process.
# `status` exits 3 when any named service is stopped.
set -euo pipefail
SERVICE=services
source "$(dirname "$0")/lib.sh"

ALL=(kafka postgres redis s3 prometheus)
ENV_FILE="$LOCAL/services.env"

usage() { echo "usage: $0 up|down|status [${ALL[*]}]" >&2; exit 2; }

write_env() {
  cat >"$ENV_FILE.tmp" <<'EOF'
# Written by infra/services.sh up; `source` it before running the integration tests.
export LEDGERLM_TEST_KAFKA=kafka://127.0.0.1:19092
export LEDGERLM_TEST_POSTGRES=postgresql+psycopg://ledgerlm:ledgerlm@127.0.0.1:15432/ledgerlm
export LEDGERLM_TEST_REDIS=redis://127.0.0.1:16379/0
export LEDGERLM_TEST_S3=http://127.0.0.1:19000
export LEDGERLM_TEST_S3_KEY=ledgerlm
export LEDGERLM_TEST_S3_SECRET=ledgerlm-secret
export LEDGERLM_TEST_S3_BUCKET=ledgerlm-test
export LEDGERLM_TEST_PROMETHEUS=http://127.0.0.1:19090
EOF
  mv -f "$ENV_FILE.tmp" "$ENV_FILE"
}

verb="${1:-}"; shift || true
case "$verb" in up | down | status) ;; *) usage ;; esac
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${ALL[@]}")
for n in "${names[@]}"; do
  [[ " ${ALL[*]} " == *" $n "* ]] || { echo "unknown service '$n'" >&2; usage; }
done
# Stop in reverse order of start.
if [ "$verb" = down ]; then
  for ((i = ${#names[@]} - 1; i >= 0; i--)); do rev+=("${names[i]}"); done
  names=("${rev[@]}")
fi

# One up/down at a time per checkout; a second caller waits, but not forever. The servers
# are started with fd 9 closed, or they would inherit the lock and hold it for life.
lock="$RUN/services-cmd.lock"
exec 9>"$lock"
if [ "$verb" != status ]; then
  flock -w 900 9 || die "another infra/services.sh held $(rel "$lock") for 15 minutes"
fi

t0=$SECONDS
failed=()
for n in "${names[@]}"; do
  if [ "$verb" = up ]; then
    # A failed service is reported but does not stop the others from starting.
    "$ROOT/infra/$n.sh" up 9>&- || failed+=("$n")
  else
    rc=0
    "$ROOT/infra/$n.sh" "$verb" 9>&- || rc=$?
    [ "$rc" = 0 ] || failed+=("$n")
  fi
done

case "$verb" in
  up)
    if [ ${#failed[@]} -gt 0 ]; then die "up failed for: ${failed[*]} (logs in $(rel "$LOGS"))"; fi
    write_env
    say "all up in $(elapsed "$t0"); env: source $(rel "$ENV_FILE")" ;;
  down)
    [ ${#failed[@]} -eq 0 ] || die "down failed for: ${failed[*]}"
    # With every service gone the env file would point tests at nothing.
    [ ${#names[@]} -lt ${#ALL[@]} ] || rm -f "$ENV_FILE" ;;
  status)
    [ ${#failed[@]} -eq 0 ] || exit 3 ;;
esac
