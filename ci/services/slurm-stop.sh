#!/usr/bin/env bash
# Stop the SLURM started by ci/services/slurm.sh: cancel what is still queued or running, then
# stop slurmd, slurmctld, slurmdbd, MariaDB and munged, each by its pid file (and only if that
# pid is still the daemon named), SIGTERM first, SIGKILL after 10 s.
# Config, state and logs stay; slurm.sh starts it again.
# --restart (used by slurm.sh when the config changed): stop only slurmd, slurmctld and
# slurmdbd, and cancel nothing: running jobs survive and the restarted controller finds them.
set -euo pipefail
RESTART=0
[ "${1:-}" = --restart ] && RESTART=1

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
  local deadline=$((SECONDS + 10))
  while live "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  if live "$pid"; then
    echo "$2 (pid $pid) ignored SIGTERM for 10 s: SIGKILL"
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

if [ $RESTART = 0 ] && [ "$(cat /proc/"$(cat /run/slurmctld.pid 2>/dev/null || echo 0)"/comm 2>/dev/null)" = slurmctld ]; then
  jobs=$(timeout 10 squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ' || true)
  if [ -n "${jobs// /}" ]; then
    echo "cancelling jobs: $jobs"
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs 2>/dev/null || true
    deadline=$((SECONDS + 15))
    while [ -n "$(timeout 5 squeue -h -t R,CG -o %A 2>/dev/null)" ] && [ "$SECONDS" -lt "$deadline" ]; do
      sleep 0.2
    done
  fi
fi
stop_pidfile /run/slurmd.pid slurmd
stop_pidfile /run/slurmctld.pid slurmctld
stop_pidfile /run/slurmdbd.pid slurmdbd
if [ $RESTART = 1 ]; then
  echo "slurm: daemons stopped for a restart"
  exit 0
fi
stop_pidfile /run/mysqld/mysqld.pid mariadbd
stop_pidfile /run/munge/munged.pid munged
echo "slurm: stopped"
