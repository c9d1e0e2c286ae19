#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2016  # check_* run as "check_$s"; job scripts expand $VARs later
# Install and start the real services the tests use, on Debian 12 as root (no systemd).
# Idempotent: what runs already is left alone. One line per service at the end:
#   started | already running | FAILED: reason     (a failure does not stop the others)
#
#   ci/services/up.sh                  # all: sshd (if sshd.sh exists) slurm sge torque mpi netns netns-sshd chromium podman tsp
#   ci/services/up.sh slurm torque     # only these
#   ci/services/up.sh --check [...]    # then run one trivial job on each (see check_* below)
#
# Packages: every service script answers `--packages`; the missing ones are installed in ONE
# apt-get call (after one apt-get update, only if something is missing). Order matters only
# inside that call: openmpi-bin (libpmix2) is on disk before slurmd first starts.
# Logs: /var/log/elsewhere-ci/<service>.log. Exit status: 0 if every service is up, else 1.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VENV=${ELSEWHERE_CI_VENV:-$REPO/.venv}
LOGS=/var/log/elsewhere-ci
ALL=(slurm sge torque mpi netns)
[ -f "$HERE/sshd.sh" ] && ALL=(sshd "${ALL[@]}")
[ -f "$HERE/netns-sshd.sh" ] && ALL=("${ALL[@]}" netns-sshd)  # after netns: sshd inside each test host
ALL+=(chromium)  # the web view's browser tests (tests/web)
ALL+=(podman)  # python= through a container runtime (tests/env)
ALL+=(tsp)  # the example scheduler plugin's real queue (tests/batch/test_tsp_plugin.py)

CHECK=0
services=()
for a in "$@"; do
  case "$a" in
    --check) CHECK=1 ;;
    -h | --help) sed -n '3,15p' "$0"; exit 0 ;;
    sshd | slurm | sge | torque | mpi | netns | netns-sshd | chromium | podman | tsp) services+=("$a") ;;
    *) echo "up.sh: unknown service '$a' (known: ${ALL[*]})" >&2; exit 2 ;;
  esac
done
[ ${#services[@]} -gt 0 ] || services=("${ALL[@]}")

[ "$(id -u)" = 0 ] || { echo "up.sh: must run as root" >&2; exit 1; }
[ -f /etc/debian_version ] || { echo "up.sh: written for Debian 12; this is not Debian" >&2; exit 1; }
mkdir -p "$LOGS"
# several test runs may start at once (developers beside CI): one up.sh at a time
exec 9>/run/lock/elsewhere-ci-up.lock
if ! flock -n 9; then
  echo "up.sh: another up.sh is running: waiting for it (at most 600 s)"
  flock -w 600 9 || { echo "up.sh: still locked after 600 s" >&2; exit 1; }
fi
now() { date +%s.%N; }
t0=$(now)

declare -A status detail seconds
packages_of() { # SERVICE
  if [ "$1" = sshd ]; then echo openssh-server openssh-client rsync; else "$HERE/$1.sh" --packages; fi
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing_of() { # SERVICE...: the packages of these services not installed yet
  local s p
  for s in "$@"; do for p in $(packages_of "$s"); do installed "$p" || echo "$p"; done; done | sort -u
}

# ---- install: one apt-get call for everything missing
missing=$(missing_of "${services[@]}" | tr '\n' ' ')
if [ -n "${missing// /}" ]; then
  export DEBIAN_FRONTEND=noninteractive
  echo "== apt-get update"
  ti=$(now)
  timeout 300 apt-get update -q 9>&- >"$LOGS/apt.log" 2>&1 || { echo "apt-get update failed:"; tail -5 "$LOGS/apt.log"; }
  if [[ " ${services[*]} " == *" sge "* ]] && ! installed gridengine-master; then "$HERE/sge.sh" --preseed; fi
  echo "== apt-get install $missing"
  # shellcheck disable=SC2086
  if ! timeout 900 apt-get install -y -q --no-install-recommends $missing 9>&- >>"$LOGS/apt.log" 2>&1; then
    echo "one apt-get call failed (tail of $LOGS/apt.log below): installing service by service"
    tail -5 "$LOGS/apt.log"
    for s in "${services[@]}"; do
      m=$(missing_of "$s" | tr '\n' ' ')
      [ -n "${m// /}" ] || continue
      # shellcheck disable=SC2086
      if ! timeout 900 apt-get install -y -q --no-install-recommends $m 9>&- >>"$LOGS/apt.log" 2>&1; then
        status[$s]=FAILED
        detail[$s]="apt-get install $m failed: $(grep -E '^E:' "$LOGS/apt.log" | tail -1)"
      fi
    done
  fi
  echo "== packages installed in $(awk -v a="$ti" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }') s"
fi

# ---- start each service
for s in "${services[@]}"; do
  [ "${status[$s]:-}" = FAILED ] && continue
  echo "== $s"
  ts=$(now)
  set +e
  # 9>&-: the daemons it starts must not inherit (and hold) the lock
  ELSEWHERE_CI_VENV=$VENV timeout 600 "$HERE/$s.sh" </dev/null 9>&- 2>&1 | tee "$LOGS/$s.log" | sed -u "s/^/   [$s] /"
  rc=${PIPESTATUS[0]}
  set -e
  seconds[$s]=$(awk -v a="$ts" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  last=$(grep -v '^[[:space:]]*$' "$LOGS/$s.log" | tail -1 || true)
  if [ "$rc" != 0 ]; then
    status[$s]=FAILED
    [ "$rc" = 124 ] && last="timed out after 600 s; $last"
    detail[$s]="$last (log: $LOGS/$s.log)"
  else
    # "<service>: <status> (...)" from our scripts; sshd.sh says "sshd [already] running, ..."
    if [[ $last =~ ^$s:\ (already\ [a-z]+|[a-z]+) ]]; then status[$s]=${BASH_REMATCH[1]}
    elif [[ $last == *already* ]]; then status[$s]="already running"
    else status[$s]=started
    fi
    detail[$s]=${last#"$s: "}
  fi
done

# ---- trivial jobs, one per service (--check)
wait_gone() { # SECONDS COMMAND...: until COMMAND prints nothing
  local deadline=$((SECONDS + $1))
  shift
  while [ -n "$("$@" 2>/dev/null)" ]; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}
ALLREDUCE='from mpi4py import MPI; c = MPI.COMM_WORLD; s = c.allreduce(c.rank + 1); assert s == c.size * (c.size + 1) // 2, s; print("rank", c.rank, "of", c.size, "sum", s)'
check_sshd() { ssh -F /var/lib/elsewhere-ci/ssh/ssh_config -o ConnectTimeout=5 ci hostname; }
check_slurm() {
  local d id
  d=$(mktemp -d /tmp/ew-check-slurm.XXXX)
  id=$(sbatch --parsable --array=0-3 -o "$d/%a.out" --wrap 'echo task $SLURM_ARRAY_TASK_ID')
  wait_gone 60 squeue -h -j "$id" -t PD,R,CG || { echo "array job $id still queued after 60 s"; return 1; }
  cat "$d"/*.out | sort | tr '\n' ' '; echo
  [ "$(cat "$d"/*.out | wc -l)" = 4 ] || return 1
  sacct -n -X -j "$id" -o JobID,State | head -4
  timeout 60 srun --mpi=pmix -n 2 "$VENV/bin/python" -c "$ALLREDUCE" || return 1
  rm -rf "$d"
}
check_sge() {
  local d
  d=$(mktemp -d /tmp/ew-check-sge.XXXX)
  timeout 60 qsub -sync y -b y -o "$d/out" -j y /bin/echo hello from sge || return 1
  cat "$d/out"
  grep -q 'hello from sge' "$d/out" || return 1
  rm -rf "$d"
}
check_torque() {
  local d id
  d=$(mktemp -d /tmp/ew-check-pbs.XXXX)
  printf '#!/bin/bash\necho hello from pbs $SLURM_JOB_ID\n' >"$d/job.sh"
  id=$(cd "$d" && PATH=/opt/elsewhere-ci/torque/bin:$PATH qsub -o "$d/out" "$d/job.sh") || return 1
  echo "qsub -> $id"
  wait_gone 60 squeue -h -j "$id" -t PD,R,CG || { echo "job $id still queued after 60 s"; return 1; }
  PATH=/opt/elsewhere-ci/torque/bin:$PATH qstat -f "$id" 2>/dev/null | grep -E 'job_state|exit_status' || true
  cat "$d/out"
  grep -q 'hello from pbs' "$d/out" || return 1
  rm -rf "$d"
}
check_mpi() {
  timeout 60 mpiexec --allow-run-as-root --oversubscribe -n 2 "$VENV/bin/python" -c "$ALLREDUCE"
}
check_netns() {
  local n
  n=$(ip netns list | grep -c '^ew-h[0-9]' || true)
  [ "$n" -ge 2 ] || return 1
  out=$(ip netns exec ew-h1 timeout 10 "$VENV/bin/python" -c '
import socket
try:
    socket.create_connection(("10.77.0.2", 9), timeout=2)
except ConnectionRefusedError:
    print("ew-h1 reaches 10.77.0.2: connection refused by the empty host, as it should be")
' 2>&1)
  echo "$out"
  [[ $out == *"as it should be"* ]]
}
check_chromium() { # Playwright (the test extras) drives Debian's chromium, as tests/web do
  timeout 60 "$VENV/bin/python" -c 'from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox", "--disable-gpu"])
    page = b.new_page()
    page.set_content("<title>ok</title>")
    print("playwright drives chromium", b.version, "- page title:", page.title())
    b.close()'
}
check_podman() { "$HERE/podman.sh"; }  # it starts one container itself
check_tsp() { "$HERE/tsp.sh"; }  # it runs one job itself
declare -A checked
if [ $CHECK = 1 ]; then
  for s in "${services[@]}"; do
    [ "${status[$s]:-}" = FAILED ] && continue
    echo "== check $s"
    tc=$(now)
    if "check_$s" 9>&- 2>&1 | sed -u "s/^/   [$s] /"; then r=ok; else r=FAILED; fi
    checked[$s]="check $r in $(awk -v a="$tc" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }') s"
  done
fi

# ---- summary
failed=0
echo "== services (total $(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }') s; logs in $LOGS)"
for s in "${services[@]}"; do
  if [ "${status[$s]:-}" = FAILED ]; then
    failed=1
    printf '%-7s FAILED: %s\n' "$s" "${detail[$s]}"
  else
    printf '%-7s %-17s %5s s  %s%s\n' "$s" "${status[$s]}" "${seconds[$s]}" "${detail[$s]}" \
      "${checked[$s]:+  [${checked[$s]}]}"
  fi
  [[ ${checked[$s]:-} == *FAILED* ]] && failed=1
done
exit $failed
