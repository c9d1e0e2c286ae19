#!/usr/bin/env bash
# Start the private sshd that elsewhere's transport tests use: 127.0.0.1:$PORT, public-key
# login only, everything (host key, client key, config, log, pid) in one folder.
#
#   bash ci/services/sshd.sh        # prints "sshd running, pid N, ..." (starts it if needed)
#   ssh -F "$DIR/ssh_config" ci     # then log in through the alias `ci`
#
# Idempotent: a second call while it runs only says so. Root, Debian 12, no systemd.
# Installs openssh-server and rsync when missing (apt-get update only then).
# Environment: ELSEWHERE_CI_SSH_DIR (default /var/lib/elsewhere-ci/ssh),
#              ELSEWHERE_CI_SSH_PORT (default 2222).
# Files in $DIR: ssh_config (alias `ci`), id_ed25519 (client key), known_hosts (pinned host
# key: strict checking stays on), sshd.log, sshd.pid, env (the above as shell variables).
set -euo pipefail

DIR=${ELSEWHERE_CI_SSH_DIR:-/var/lib/elsewhere-ci/ssh}
PORT=${ELSEWHERE_CI_SSH_PORT:-2222}
SSHD=/usr/sbin/sshd
PIDFILE=$DIR/sshd.pid

# Print the pid of *our* sshd if it runs. A pid file alone proves nothing (pids are reused),
# so the process must also name our config file on its command line.
our_pid() {
  [ -s "$PIDFILE" ] || return 1
  local pid
  pid=$(cat "$PIDFILE")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$DIR/sshd_config" || return 1
  echo "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

if pid=$(our_pid); then
  echo "sshd already running, pid $pid, on 127.0.0.1:$PORT (config: $DIR/ssh_config, host alias ci)"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "sshd.sh: must run as root (it may install packages and binds a privileged daemon)" >&2
  exit 1
fi

missing=()
[ -x "$SSHD" ] || missing+=(openssh-server)
command -v rsync >/dev/null 2>&1 || missing+=(rsync)
command -v ssh >/dev/null 2>&1 || missing+=(openssh-client)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

if port_open; then
  echo "sshd.sh: 127.0.0.1:$PORT is already taken by another program; set ELSEWHERE_CI_SSH_PORT" >&2
  exit 1
fi

mkdir -p "$DIR"
chmod 700 "$DIR"
mkdir -p /run/sshd          # sshd's privilege-separation directory
chmod 755 /run/sshd

[ -f "$DIR/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C elsewhere-ci-host -f "$DIR/host_ed25519"
[ -f "$DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C elsewhere-ci-client -f "$DIR/id_ed25519"
install -m 600 "$DIR/id_ed25519.pub" "$DIR/authorized_keys"

cat >"$DIR/sshd_config" <<CONF
# written by ci/services/sshd.sh
ListenAddress 127.0.0.1:$PORT
HostKey $DIR/host_ed25519
PidFile $PIDFILE
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
# many multiplexed sessions on one connection, many parallel logins in tests
MaxSessions 64
MaxStartups 100:30:200
Subsystem sftp internal-sftp
# VERBOSE logs "Connection from ..." too; tests count logins in this log
LogLevel VERBOSE
CONF

# Strict host key checking stays on: the client trusts exactly this host key.
hostkey=$(cut -d' ' -f1,2 "$DIR/host_ed25519.pub")
printf '[127.0.0.1]:%s %s\n[localhost]:%s %s\n' "$PORT" "$hostkey" "$PORT" "$hostkey" >"$DIR/known_hosts"

cat >"$DIR/ssh_config" <<CONF
# written by ci/services/sshd.sh; use as: ssh -F $DIR/ssh_config ci
Host ci
  HostName 127.0.0.1
  Port $PORT
  User root
  IdentityFile $DIR/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $DIR/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
CONF

cat >"$DIR/env" <<CONF
ELSEWHERE_CI_SSH_DIR=$DIR
ELSEWHERE_CI_SSH_CONFIG=$DIR/ssh_config
ELSEWHERE_CI_SSH_HOST=ci
ELSEWHERE_CI_SSH_PORT=$PORT
CONF

"$SSHD" -t -f "$DIR/sshd_config"
rm -f "$PIDFILE"
"$SSHD" -f "$DIR/sshd_config" -E "$DIR/sshd.log"   # forks into the background, writes $PIDFILE

for _ in $(seq 1 100); do
  port_open && [ -s "$PIDFILE" ] && break
  sleep 0.05
done
if ! pid=$(our_pid) || ! port_open; then
  echo "sshd.sh: sshd did not start; last lines of $DIR/sshd.log:" >&2
  tail -n 20 "$DIR/sshd.log" >&2 || true
  exit 1
fi
# One real login proves keys, config and known_hosts fit together.
if ! out=$(ssh -F "$DIR/ssh_config" -o ConnectTimeout=5 ci true 2>&1); then
  echo "sshd.sh: sshd runs (pid $pid) but a test login failed: $out" >&2
  exit 1
fi
echo "sshd running, pid $pid, on 127.0.0.1:$PORT (config: $DIR/ssh_config, host alias ci)"
