#!/usr/bin/env bash
# Stop the sshd started by ci/services/sshd.sh (by its pid, after checking that the pid is
# still that sshd). Keys and config stay, so the next start trusts the same host key.
# Sessions already open (their own sshd processes) end when their clients disconnect.
set -euo pipefail

DIR=${ELSEWHERE_CI_SSH_DIR:-/var/lib/elsewhere-ci/ssh}
PIDFILE=$DIR/sshd.pid

pid=$(cat "$PIDFILE" 2>/dev/null || true)
if ! [[ $pid =~ ^[0-9]+$ ]] || ! [ -r "/proc/$pid/cmdline" ] \
  || ! tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$DIR/sshd_config"; then
  echo "sshd not running (nothing to stop in $DIR)"
  rm -f "$PIDFILE"
  exit 0
fi
kill "$pid"
for _ in $(seq 1 100); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
if kill -0 "$pid" 2>/dev/null; then
  echo "sshd pid $pid did not stop within 5 s" >&2
  exit 1
fi
rm -f "$PIDFILE"
echo "stopped sshd pid $pid"
