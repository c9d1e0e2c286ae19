#!/usr/bin/env bash
# Stop the sshds that netns-sshd.sh started in the test hosts, each by its pid file, after
# checking that the pid is still that sshd (our config on its command line). Keys and
# configs stay, so the next start trusts the same host keys. Sessions already open (their own
# sshd processes) end when their clients disconnect, or ~15 s after a client vanished.
set -euo pipefail

DIR=${ELSEWHERE_CI_NETNS_SSH_DIR:-/var/lib/elsewhere-ci/netns-ssh}
[ "$(id -u)" = 0 ] || { echo "netns-sshd-stop.sh: must run as root" >&2; exit 1; }

stopped=0
for d in "$DIR"/h*/; do
  [ -d "$d" ] || continue
  d=${d%/}
  name=$(basename "$d")
  pid=$(cat "$d/sshd.pid" 2>/dev/null || true)
  if ! [[ $pid =~ ^[0-9]+$ ]] || ! [ -r "/proc/$pid/cmdline" ] \
    || ! tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$d/sshd_config"; then
    rm -f "$d/sshd.pid"
    continue
  fi
  kill "$pid"
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null && break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null; then
    echo "$name: sshd pid $pid did not stop within 5 s" >&2
    exit 1
  fi
  rm -f "$d/sshd.pid"
  echo "$name: stopped sshd pid $pid"
  stopped=$((stopped + 1))
done
[ $stopped -gt 0 ] || echo "netns-sshd: nothing running (nothing to stop in $DIR)"
