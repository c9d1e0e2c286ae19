#!/usr/bin/env bash
# Single-node SLURM 22.05 for the tests: munged, slurmctld (127.0.0.1:6817), slurmd (:6818),
# and with accounting=slurmdbd also MariaDB (unix socket only) + slurmdbd (127.0.0.1:6819).
# Root, Debian 12, no systemd. The packages come from ci/services/up.sh (one apt-get call);
# `slurm.sh --packages` lists them. Idempotent: when everything runs with the same config it
# only says so; when the config changed it restarts the daemons (slurm-stop.sh --restart:
# running jobs are kept). A cold start cancels the jobs left in the saved state.
#
# Config: /etc/slurm/slurm.conf (the default path: no SLURM_CONF needed). Choices, and why:
#   CPUs=8 on a 2-core machine (SlurmdParameters=config_overrides): jobs and steps with
#     several ranks (srun -n 4) start instead of pending forever.
#   openmpi-bin (brings libpmix2) is installed before slurmd starts, so `srun --mpi=pmix`
#     works (slurmd loads the MPI plugins it can find at start). MpiDefault stays none.
#   MaxArraySize=1001: array indices 0..1000, so chunking of large jobs can be tested.
#   MinJobAge=5: a finished job leaves squeue/scontrol soon after it ends (measured here:
#     9 s; the controller purges on its own background cycle), so a test can watch a job
#     leave the queue and fall back to accounting.
#   Accounting (ELSEWHERE_CI_SLURM_ACCOUNTING):
#     slurmdbd (default) - real `sacct`, as on a real cluster, for jobs that left the queue.
#       Measured here: +10 s of apt-get (mariadb-server, slurmdbd) and +1.5 s of start
#       (1.7 s instead of 0.2 s): about 12 s of a 20-minute CI budget, so the realistic setup
#       wins. Records reach slurmdbd a moment after a job ends: poll, do not read once.
#     none - no database; `sacct -c` (reads the jobcomp file) still shows finished jobs.
#   In both modes JobCompType=jobcomp/filetxt writes /var/log/slurm/jobcomp.log (`sacct -c`).
# Partitions: debug (default) and other, both on the one node.
#
# Usage: slurm.sh [--packages]
set -euo pipefail

ACCOUNTING=${ELSEWHERE_CI_SLURM_ACCOUNTING:-slurmdbd}
CPUS=${ELSEWHERE_CI_SLURM_CPUS:-8}
CONF=/etc/slurm/slurm.conf
DBD_CONF=/etc/slurm/slurmdbd.conf
LOG_DIR=/var/log/slurm
JOBCOMP=$LOG_DIR/jobcomp.log
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

case "$ACCOUNTING" in slurmdbd | none) ;; *)
  echo "slurm.sh: ELSEWHERE_CI_SLURM_ACCOUNTING must be slurmdbd or none, not '$ACCOUNTING'" >&2
  exit 2 ;;
esac

if [ "${1:-}" = --packages ]; then
  echo munge slurmctld slurmd slurm-client openmpi-bin
  [ "$ACCOUNTING" = slurmdbd ] && echo slurmdbd mariadb-server
  exit 0
fi

# wait_until SECONDS WHAT COMMAND...: poll COMMAND every 0.1 s until it succeeds or time is up.
wait_until() {
  local limit=$1 what=$2 deadline=$((SECONDS + $1))
  shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "slurm.sh: timed out after ${limit} s waiting for $what" >&2
      return 1
    fi
    sleep 0.1
  done
}

# live PID: the process exists and is not a zombie (PID 1 here reaps exited daemons late)
live() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]; }

# alive PIDFILE NAME: the pid file names a live process whose command name is NAME.
alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && live "$pid"
}

fail_with_logs() {
  echo "slurm.sh: $1" >&2
  for f in "$LOG_DIR"/slurmctld.log "$LOG_DIR"/slurmd.log "$LOG_DIR"/slurmdbd.log; do
    [ -f "$f" ] && { echo "--- tail $f" >&2; tail -n 15 "$f" >&2; }
  done
  exit 1
}

[ "$(id -u)" = 0 ] || { echo "slurm.sh: must run as root" >&2; exit 1; }
need=(/usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged /usr/bin/sbatch /usr/bin/mpiexec)
[ "$ACCOUNTING" = slurmdbd ] && need+=(/usr/sbin/slurmdbd /usr/sbin/mariadbd)
for f in "${need[@]}"; do
  [ -x "$f" ] || { echo "slurm.sh: $f is missing: run ci/services/up.sh slurm (installs $("$0" --packages | tr '\n' ' '))" >&2; exit 1; }
done

HOST=$(hostname -s)
MEM_MB=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
if [ "$ACCOUNTING" = slurmdbd ]; then
  STORAGE="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819"
else
  STORAGE="AccountingStorageType=accounting_storage/none"
fi

NEW_CONF=$(cat <<CONF
# Written by elsewhere's ci/services/slurm.sh: single-node SLURM for the tests.
ClusterName=ewci
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups without systemd here
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
$STORAGE
JobCompType=jobcomp/filetxt
JobCompLoc=$JOBCOMP
MinJobAge=5
MaxArraySize=1001
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
Waittime=0
SlurmdParameters=config_overrides
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${MEM_MB} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=other Nodes=ALL Default=NO MaxTime=INFINITE State=UP
CONF
)

running() {
  alive /run/munge/munged.pid munged && alive /run/slurmctld.pid slurmctld \
    && alive /run/slurmd.pid slurmd \
    && { [ "$ACCOUNTING" = none ] || alive /run/slurmdbd.pid slurmdbd; }
}

# A cold start (no controller running): jobs in its saved state belong to processes that are
# gone (e.g. a session that ended before CI); they are cancelled once the node is up.
COLD=1
alive /run/slurmctld.pid slurmctld && COLD=0
if [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$NEW_CONF" ] && running; then
  echo "slurm: already running (config $CONF, accounting $ACCOUNTING)"
  exit 0
fi
if running || alive /run/slurmctld.pid slurmctld || alive /run/slurmd.pid slurmd; then
  echo "config changed or a daemon is missing: restarting SLURM (running jobs are kept)"
  "$HERE/slurm-stop.sh" --restart
fi

echo "writing $CONF (node $HOST, $CPUS CPUs, ${MEM_MB} MB, accounting $ACCOUNTING)"
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOG_DIR"
printf '%s\n' "$NEW_CONF" >"$CONF"

# munge: the package's postinst usually made the key; make one if not
if [ ! -s /etc/munge/munge.key ]; then
  echo "creating /etc/munge/munge.key"
  mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge
chown munge:munge /run/munge
chmod 755 /run/munge
if ! alive /run/munge/munged.pid munged; then
  echo "starting munged"
  runuser -u munge -- /usr/sbin/munged
fi
munge_ok() { munge -n | unmunge; }
wait_until 10 "munged to answer" munge_ok || fail_with_logs "munged does not answer"

if [ "$ACCOUNTING" = slurmdbd ]; then
  # MariaDB without networking: slurmdbd talks to it over the unix socket only
  mkdir -p /run/mysqld
  chown mysql:mysql /run/mysqld
  if ! mariadb -e 'select 1' >/dev/null 2>&1; then
    echo "starting mariadbd (unix socket /run/mysqld/mysqld.sock, no TCP)"
    # setsid: its own session, so a Ctrl-C on the test command does not reach it
    setsid /usr/sbin/mariadbd --user=mysql --skip-networking --socket=/run/mysqld/mysqld.sock \
      --pid-file=/run/mysqld/mysqld.pid </dev/null >"$LOG_DIR/mariadb.log" 2>&1 &
    wait_until 30 "MariaDB to answer" mariadb -e 'select 1' || fail_with_logs "MariaDB did not start (see $LOG_DIR/mariadb.log)"
  fi
  mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'ewci';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  cat >"$DBD_CONF" <<DBD
# Written by elsewhere's ci/services/slurm.sh
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
PidFile=/run/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=ewci
StorageLoc=slurm_acct_db
DBD
  chmod 600 "$DBD_CONF"
  if ! alive /run/slurmdbd.pid slurmdbd; then
    echo "starting slurmdbd"
    /usr/sbin/slurmdbd
  fi
  wait_until 30 "slurmdbd to answer" sacctmgr -n show cluster || fail_with_logs "slurmdbd does not answer"
  if ! sacctmgr -n -P show cluster format=cluster | grep -qx ewci; then
    sacctmgr -i add cluster ewci >/dev/null
  fi
fi

echo "starting slurmctld"
/usr/sbin/slurmctld -i          # forks, writes /run/slurmctld.pid
ctld_up() { scontrol ping | grep -q UP; }
wait_until 30 "slurmctld to answer" ctld_up || fail_with_logs "slurmctld does not answer"
echo "starting slurmd"
/usr/sbin/slurmd                # forks, writes /run/slurmd.pid
# up and schedulable; jobs that survived a restart may keep it mixed or allocated
node_ready() { [[ $(sinfo -h -N -n "$HOST" -o %T -p debug) =~ ^(idle|mixed|allocated|completing)$ ]]; }
wait_until 30 "node $HOST to come up" node_ready \
  || fail_with_logs "node state is '$(sinfo -h -N -o %T 2>&1 | head -1)'; reason: $(sinfo -h -R 2>&1)"

if [ $COLD = 1 ]; then
  left=$(squeue -h -o %A | sort -u | tr '\n' ' ')
  if [ -n "${left// /}" ]; then
    echo "cancelling jobs left in the saved state from before: $left"
    # shellcheck disable=SC2086
    scancel $left || true
  fi
fi
srun --mpi=list 2>&1 | grep -qw pmix || fail_with_logs "slurmd has no pmix MPI plugin (is libpmix2 installed?)"
echo "slurm: started (config $CONF, accounting $ACCOUNTING, $CPUS CPUs, partitions debug* other)"
