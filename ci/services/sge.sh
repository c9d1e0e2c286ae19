#!/usr/bin/env bash
# Single-node Son of Grid Engine 8.1.9 for the tests: sge_qmaster (port 6444) and sge_execd
# (port 6445) on this machine, beside the SLURM of slurm.sh (ports 6817-6819: no clash).
# Root, Debian 12, no systemd. Packages come from ci/services/up.sh (one apt-get call; debconf
# answers first: `sge.sh --preseed`); `sge.sh --packages` lists them.
# Idempotent: when both daemons run it only says so.
#
# Cell: SGE_ROOT=/var/lib/gridengine SGE_CELL=default (Debian's /usr/bin/q* wrappers default
# to these, so no environment is needed). Queue all.q on this host with 8 slots (on 2 cores,
# like SLURM's 8 CPUs), load_thresholds NONE (a busy test machine must not put the queue in
# alarm state), shell /bin/bash with unix_behavior (a script's #! line is honoured),
# parallel environments smp ($pe_slots) and mpi ($fill_up). Scheduler runs every second.
# Finished jobs: `qacct -j ID` (accounting file flushed at once).
# What was needed here:
#   - 127.0.0.1 reverse-resolves to "localhost": host_aliases maps it to $(hostname), or
#     qmaster refuses the execd;
#   - min_uid/min_gid 0 so root may run jobs, set before execd starts (execd caches it);
#   - gridengine-client conflicts with slurm-wlm-torque (both ship /usr/bin/qsub): the PBS
#     wrappers are unpacked privately by torque.sh instead.
#
# Usage: sge.sh [--packages | --preseed]
set -euo pipefail

export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
SLOTS=${ELSEWHERE_CI_SGE_SLOTS:-8}
PIDDIR=/var/run/gridengine
H=$(hostname)

if [ "${1:-}" = --packages ]; then
  echo gridengine-master gridengine-exec gridengine-client
  exit 0
fi
if [ "${1:-}" = --preseed ]; then
  # the package postinst then creates the cell "default" with this host as master
  for p in gridengine-common gridengine-client gridengine-master gridengine-exec; do
    printf '%s shared/gridengineconfig boolean true\n' "$p"
    printf '%s shared/gridenginecell string default\n' "$p"
    printf '%s shared/gridenginemaster string %s\n' "$p" "$H"
  done | debconf-set-selections
  exit 0
fi

wait_until() { # SECONDS WHAT COMMAND...
  local limit=$1 what=$2 deadline=$((SECONDS + $1))
  shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "sge.sh: timed out after ${limit} s waiting for $what" >&2
      return 1
    fi
    sleep 0.1
  done
}

# live PID: the process exists and is not a zombie (PID 1 here reaps exited daemons late)
live() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]; }

alive() { # PIDFILE NAME
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && live "$pid"
}

fail_with_logs() {
  echo "sge.sh: $1" >&2
  for f in /var/spool/gridengine/qmaster/messages /var/spool/gridengine/execd/"$H"/messages /tmp/execd_messages.* /tmp/qmaster_messages.*; do
    [ -f "$f" ] && { echo "--- tail $f" >&2; tail -n 15 "$f" >&2; }
  done
  exit 1
}

[ "$(id -u)" = 0 ] || { echo "sge.sh: must run as root" >&2; exit 1; }
for f in /usr/sbin/sge_qmaster /usr/sbin/sge_execd /usr/bin/qconf; do
  [ -x "$f" ] || { echo "sge.sh: $f is missing: run ci/services/up.sh sge" >&2; exit 1; }
done
[ -f "$SGE_ROOT/$SGE_CELL/common/act_qmaster" ] \
  || { echo "sge.sh: cell $SGE_ROOT/$SGE_CELL was not created at install (debconf answers missing?): reinstall with ci/services/up.sh sge" >&2; exit 1; }

# qmaster writes its pid into its spool folder (SGE_MASTER_PIDFILE is not honoured)
QMASTER_PID=$(awk '$1 == "qmaster_spool_dir" {print $2 "/qmaster.pid"}' "$SGE_ROOT/$SGE_CELL/common/bootstrap")
EXECD_PID=$PIDDIR/execd.pid
if alive "$QMASTER_PID" sge_qmaster && alive $EXECD_PID sge_execd; then
  echo "sge: already running (SGE_ROOT=$SGE_ROOT SGE_CELL=$SGE_CELL, queue all.q, $SLOTS slots)"
  exit 0
fi

# The cell names its master; a machine whose name changed since install needs the new name.
if [ "$(cat "$SGE_ROOT/$SGE_CELL/common/act_qmaster")" != "$H" ]; then
  echo "act_qmaster was $(cat "$SGE_ROOT/$SGE_CELL/common/act_qmaster"): setting it to $H"
  echo "$H" >"$SGE_ROOT/$SGE_CELL/common/act_qmaster"
fi
# Every name this host answers to (e.g. "localhost" for 127.0.0.1) is an alias of $H.
names=$( { getent hosts 127.0.0.1; getent hosts "$H"; } | awk '{for (i = 2; i <= NF; i++) print $i}' \
  | grep -vx "$H" | sort -u | tr '\n' ' ')
echo "host_aliases: $H $names"
echo "$H $names" >"$SGE_ROOT/$SGE_CELL/common/host_aliases"

mkdir -p $PIDDIR
chown sgeadmin:sgeadmin $PIDDIR
COLD=0
if ! alive "$QMASTER_PID" sge_qmaster; then
  COLD=1
  if (exec 3<>/dev/tcp/127.0.0.1/6444) 2>/dev/null; then
    echo "sge.sh: port 6444 is taken, but not by the sge_qmaster of $QMASTER_PID" >&2
    exit 1
  fi
  echo "starting sge_qmaster"
  /usr/sbin/sge_qmaster
fi
wait_until 30 "sge_qmaster to answer" qconf -sh || fail_with_logs "sge_qmaster does not answer"

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# qconf -s* wraps long values onto "\"-continued lines: join them before editing
unwrap() { sed -e ':a' -e '/\\$/N; s/\\\n[[:space:]]*/ /; ta'; }
# qconf -Mconf takes the config name from the file name
qconf -sconf global | unwrap | sed -e 's/^min_uid .*/min_uid 0/' -e 's/^min_gid .*/min_gid 0/' \
  -e 's/^reporting_params .*/reporting_params accounting=true reporting=false flush_time=00:00:01 joblog=false sharelog=00:00:00 accounting_flush_time=00:00:00/' \
  >"$W/global"
(cd "$W" && qconf -Mconf global >/dev/null)
qconf -ssconf | unwrap | sed -e 's/^schedule_interval .*/schedule_interval 0:0:1/' \
  -e 's/^flush_submit_sec .*/flush_submit_sec 1/' -e 's/^flush_finish_sec .*/flush_finish_sec 1/' \
  -e 's/^job_load_adjustments .*/job_load_adjustments NONE/' \
  -e 's/^load_adjustment_decay_time .*/load_adjustment_decay_time 0:0:0/' \
  -e 's/^schedd_job_info .*/schedd_job_info true/' >"$W/sconf"
qconf -Msconf "$W/sconf" >/dev/null

qconf -sh | grep -qx "$H" || qconf -ah "$H" >/dev/null
qconf -ss | grep -qx "$H" || qconf -as "$H" >/dev/null
if ! qconf -sel 2>/dev/null | grep -qx "$H"; then
  printf 'hostname %s\nload_scaling NONE\ncomplex_values NONE\nuser_lists NONE\nxuser_lists NONE\nprojects NONE\nxprojects NONE\nusage_scaling NONE\nreport_variables NONE\n' "$H" >"$W/exechost"
  qconf -Ae "$W/exechost" >/dev/null
fi
if ! qconf -shgrpl 2>/dev/null | grep -qx @allhosts; then
  printf 'group_name @allhosts\nhostlist %s\n' "$H" >"$W/allhosts"
  qconf -Ahgrp "$W/allhosts" >/dev/null
fi
for pe in smp mpi; do
  rule=\$pe_slots
  [ $pe = mpi ] && rule=\$fill_up
  printf 'pe_name %s\nslots 999\nuser_lists NONE\nxuser_lists NONE\nstart_proc_args NONE\nstop_proc_args NONE\nallocation_rule %s\ncontrol_slaves TRUE\njob_is_first_task FALSE\nurgency_slots min\naccounting_summary TRUE\nqsort_args NONE\n' \
    "$pe" "$rule" >"$W/$pe"
  if qconf -spl 2>/dev/null | grep -qx $pe; then qconf -Mp "$W/$pe" >/dev/null; else qconf -Ap "$W/$pe" >/dev/null; fi
done
# all.q from the built-in template, with our settings
qconf -sq | unwrap | sed -e 's/^qname .*/qname all.q/' -e 's/^hostlist .*/hostlist @allhosts/' \
  -e "s/^slots .*/slots $SLOTS/" -e 's/^pe_list .*/pe_list smp mpi/' \
  -e 's#^shell .*#shell /bin/bash#' -e 's/^shell_start_mode .*/shell_start_mode unix_behavior/' \
  -e 's/^load_thresholds .*/load_thresholds NONE/' >"$W/all.q"
if qconf -sql 2>/dev/null | grep -qx all.q; then qconf -Mq "$W/all.q" >/dev/null; else qconf -Aq "$W/all.q" >/dev/null; fi

if ! alive $EXECD_PID sge_execd; then
  echo "starting sge_execd"
  SGE_EXECD_PIDFILE=$EXECD_PID /usr/sbin/sge_execd
fi
queue_ok() { # all.q@host listed, with a load value and no state flags
  qstat -f -q all.q | awk -v q="all.q@$H" '$1 == q { found = 1; if (NF == 5 && $4 != "-NA-") ok = 1 } END { exit !(found && ok) }'
}
wait_until 60 "execd to report all.q@$H ready" queue_ok \
  || fail_with_logs "queue not ready: $(qstat -f -q all.q 2>&1 | grep "all.q@" || true)"
if [ $COLD = 1 ] && [ -n "$(qstat -u '*')" ]; then
  # jobs spooled before a cold start belong to processes that are gone (an ended session)
  echo "deleting jobs left in the spool from before: $(qstat -u '*' | awk 'NR > 2 {print $1}' | sort -u | tr '\n' ' ')"
  qdel -f -u '*' >/dev/null 2>&1 || true
fi
echo "sge: started (SGE_ROOT=$SGE_ROOT SGE_CELL=$SGE_CELL, queue all.q, $SLOTS slots, pe smp mpi)"
