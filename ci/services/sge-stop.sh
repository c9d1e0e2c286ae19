#!/usr/bin/env bash
# Stop the Grid Engine started by ci/services/sge.sh: delete all jobs, then stop sge_execd and
# sge_qmaster by their pid files (only if the pid is still that daemon), SIGTERM first,
# SIGKILL after 15 s. The cell's configuration stays; sge.sh starts it again.
set -euo pipefail
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
PIDDIR=/var/run/gridengine
QMASTER_PID=$(awk '$1 == "qmaster_spool_dir" {print $2 "/qmaster.pid"}' "$SGE_ROOT/$SGE_CELL/common/bootstrap" 2>/dev/null || true)

# live PID: the process exists and is not a zombie (PID 1 here reaps exited daemons late)
live() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]; }

stop_pidfile() { # PIDFILE NAME
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 0
  if ! [[ $pid =~ ^[0-9]+$ ]] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$2" ] || ! live "$pid"; then
    rm -f "$1"
    return 0
  fi
  echo "stopping $2 (pid $pid)"
  kill "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 15))
  while live "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  if live "$pid"; then
    echo "$2 (pid $pid) ignored SIGTERM for 15 s: SIGKILL"
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

if [ "$(cat /proc/"$(cat "$QMASTER_PID" 2>/dev/null || echo 0)"/comm 2>/dev/null)" = sge_qmaster ]; then
  if [ -n "$(timeout 10 qstat -u '*' 2>/dev/null)" ]; then
    echo "deleting all jobs"
    timeout 10 qdel -f -u '*' >/dev/null 2>&1 || true
    deadline=$((SECONDS + 15))
    while [ -n "$(timeout 5 qstat -u '*' 2>/dev/null)" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
  fi
fi
stop_pidfile $PIDDIR/execd.pid sge_execd
[ -n "$QMASTER_PID" ] && stop_pidfile "$QMASTER_PID" sge_qmaster
echo "sge: stopped"
