#!/usr/bin/env bash
# An sshd inside each test host of netns.sh, so that ssh tests have several real hosts:
# host ew-hI gets an sshd listening on 10.77.0.I:22 (its own address, in its own network
# namespace), public-key login as root only, everything in one folder per host.
#
#   ci/services/netns.sh && ci/services/netns-sshd.sh      # prints one line per host with its pid
#   ip netns exec ew-h1 ssh -F "$DIR/ssh_config" h2 hostname
#
# RULE: 10.77.0.0/24 exists only inside the namespaces. Never connect to it from the root
# namespace: run the client inside one (ip netns exec ew-h1 ...). This script follows the rule
# too: it checks the listening sockets through /proc/PID/net/tcp, and the test login it makes
# runs inside ew-h1.
#
# Idempotent: an sshd that runs, is ours (our config on its command line) and sits in the
# namespace that now carries the host's name is left alone; one left in a namespace that was
# deleted or rebuilt (netns-down.sh, netns.sh) is stopped, by its pid, and started again.
# Stop with netns-sshd-stop.sh. Root, Debian 12, no systemd; `--packages` lists the packages.
#
# Environment: ELSEWHERE_CI_NETNS_SSH_DIR (default /var/lib/elsewhere-ci/netns-ssh).
# Files in $DIR: id_ed25519 (client key, shared by all hosts), ssh_config (aliases h1..hN ->
# 10.77.0.1..N, strict host key checking against known_hosts), known_hosts, env (for
# tests/netns_ssh.py), and hI/ per host: host_ed25519 (its own host key), sshd_config,
# sshd.pid, sshd.log (LogLevel VERBOSE: one "Connection from" line per login).
set -euo pipefail

if [ "${1:-}" = --packages ]; then
  echo openssh-server openssh-client rsync iproute2
  exit 0
fi

DIR=${ELSEWHERE_CI_NETNS_SSH_DIR:-/var/lib/elsewhere-ci/netns-ssh}
SSHD=/usr/sbin/sshd
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

[ "$(id -u)" = 0 ] || { echo "netns-sshd.sh: must run as root" >&2; exit 1; }
[ -x "$SSHD" ] || { echo "netns-sshd.sh: $SSHD is missing (apt-get install openssh-server)" >&2; exit 1; }
command -v ssh >/dev/null || { echo "netns-sshd.sh: ssh is missing (apt-get install openssh-client)" >&2; exit 1; }

# the test hosts, in number order: ew-h1 ew-h2 ...
mapfile -t HOSTS < <(ip netns list | awk '$1 ~ /^ew-h[0-9]+$/ {print substr($1, 5)}' | sort -n)
if [ ${#HOSTS[@]} -lt 2 ]; then
  echo "netns-sshd.sh: no test hosts ew-h1.. (found ${#HOSTS[@]}): run $HERE/netns.sh first" >&2
  exit 1
fi

# Print the pid of host I's sshd if it runs, is ours and sits in the namespace ew-hI now.
our_pid() { # I
  local d=$DIR/h$1 pid
  [ -s "$d/sshd.pid" ] || return 1
  pid=$(cat "$d/sshd.pid")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$d/sshd_config" || return 1
  grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null && return 1
  echo "$pid"
}
in_namespace() { # PID I: the process lives in the network namespace now named ew-hI
  [ "$(stat -L -c %i "/proc/$1/ns/net" 2>/dev/null)" = "$(stat -L -c %i "/run/netns/ew-h$2" 2>/dev/null)" ]
}
# 10.77.0.I:22 in LISTEN state in the process's own namespace (read from /proc, no packet sent)
listening() { # PID I
  local want
  want=$(printf '%02X%02X%02X%02X:0016' "$2" 0 77 10)   # little-endian 10.77.0.I, port 22
  awk -v w="$want" '$2 == w && $4 == "0A" {found=1} END {exit !found}' "/proc/$1/net/tcp" 2>/dev/null
}
stop_pid() { # PID
  kill "$1" 2>/dev/null || return 0
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.05; done
  echo "netns-sshd.sh: sshd pid $1 did not stop within 5 s" >&2
  return 1
}

mkdir -p "$DIR" /run/sshd
chmod 700 "$DIR"
chmod 755 /run/sshd
[ -f "$DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C elsewhere-ci-netns-client -f "$DIR/id_ed25519"
install -m 600 "$DIR/id_ed25519.pub" "$DIR/authorized_keys"

: >"$DIR/known_hosts.new"
{
  echo "# written by ci/services/netns-sshd.sh; use inside a test host only:"
  echo "#   ip netns exec ew-h1 ssh -F $DIR/ssh_config h2"
} >"$DIR/ssh_config.new"

for i in "${HOSTS[@]}"; do
  d=$DIR/h$i
  addr=10.77.0.$i
  mkdir -p "$d"
  chmod 700 "$d"
  [ -f "$d/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C "elsewhere-ci-h$i" -f "$d/host_ed25519"
  echo "$addr $(cut -d' ' -f1,2 "$d/host_ed25519.pub")" >>"$DIR/known_hosts.new"
  cat >>"$DIR/ssh_config.new" <<CONF
Host h$i $addr
  HostName $addr
  Port 22
  User root
  IdentityFile $DIR/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $DIR/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
CONF
  cat >"$d/sshd_config.new" <<CONF
# written by ci/services/netns-sshd.sh: the sshd of test host ew-h$i
ListenAddress $addr:22
HostKey $d/host_ed25519
PidFile $d/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
MaxSessions 64
MaxStartups 100:30:200
Subsystem sftp internal-sftp
# a session whose client vanished (a test cut the link) ends within ~15 s
ClientAliveInterval 5
ClientAliveCountMax 3
LogLevel VERBOSE
CONF
  mv "$d/sshd_config.new" "$d/sshd_config"
done
mv "$DIR/known_hosts.new" "$DIR/known_hosts"
mv "$DIR/ssh_config.new" "$DIR/ssh_config"
aliases=$(printf 'h%s ' "${HOSTS[@]}")
cat >"$DIR/env" <<CONF
ELSEWHERE_CI_NETNS_SSH_DIR=$DIR
ELSEWHERE_CI_NETNS_SSH_CONFIG=$DIR/ssh_config
ELSEWHERE_CI_NETNS_SSH_HOSTS=${aliases% }
CONF

for i in "${HOSTS[@]}"; do
  d=$DIR/h$i
  if pid=$(our_pid "$i"); then
    if in_namespace "$pid" "$i" && listening "$pid" "$i"; then
      echo "h$i: sshd already running, pid $pid, on 10.77.0.$i:22 in ew-h$i"
      continue
    fi
    echo "h$i: sshd pid $pid is not listening in the current ew-h$i (namespace rebuilt?): restarting it"
    stop_pid "$pid"
  fi
  "$SSHD" -t -f "$d/sshd_config"
  rm -f "$d/sshd.pid"
  ip netns exec "ew-h$i" "$SSHD" -f "$d/sshd_config" -E "$d/sshd.log"  # forks, writes the pid file
  pid=""
  for _ in $(seq 1 100); do
    if pid=$(our_pid "$i") && listening "$pid" "$i"; then break; fi
    pid=""
    sleep 0.05
  done
  if [ -z "$pid" ]; then
    echo "netns-sshd.sh: the sshd of ew-h$i did not start; last lines of $d/sshd.log:" >&2
    tail -n 20 "$d/sshd.log" >&2 || true
    exit 1
  fi
  echo "h$i: sshd started, pid $pid, on 10.77.0.$i:22 in ew-h$i"
done

# One real login to each host, from inside ew-h1, proves keys, config and known_hosts fit.
first=${HOSTS[0]}
for i in "${HOSTS[@]}"; do
  if ! out=$(timeout 20 ip netns exec "ew-h$first" ssh -F "$DIR/ssh_config" -o ConnectTimeout=5 \
      "h$i" true 2>&1); then
    echo "netns-sshd.sh: sshd of ew-h$i runs but a test login from ew-h$first failed: $out" >&2
    exit 1
  fi
done
echo "netns-sshd: ${#HOSTS[@]} hosts (${aliases% }) logged into from ew-h$first; config: $DIR/ssh_config"
