#!/usr/bin/env bash
# Test hosts for the peer network: N network namespaces ew-h1..ew-hN (default 3), host i at
# 10.77.0.i/24 on its eth0, all plugged into one bridge (br0) that lives in its own namespace
# ew-br, so the root namespace gets no interface, route or address of this subnet.
# Never send anything to 10.77.0.0/24 from the root namespace: it is not routed there.
#
# Multicast works between the hosts: the bridge floods it (mcast_snooping 0, so no IGMP querier
# is needed) and every host routes 224.0.0.0/4 out of eth0 (there is no default route).
# A sender may also set IP_MULTICAST_IF to its own address. netns.sh proves it once: a
# datagram from ew-h1 to 239.255.77.1 must reach ew-h2.
#
# Run a program on host i:  ip netns exec ew-h$i CMD...   (or nsenter --net=/run/netns/ew-h$i)
# Idempotent: when exactly these N hosts exist it only says so; any other set is rebuilt.
# Usage: netns.sh [N]        Undo: netns-down.sh
set -euo pipefail

N=${1:-${ELSEWHERE_CI_NETNS_HOSTS:-3}}
BR=ew-br
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GROUP=239.255.77.1
PORT=47701

if [ "$N" = --packages ]; then
  echo iproute2
  exit 0
fi
if ! [[ $N =~ ^[0-9]+$ ]] || [ "$N" -lt 2 ] || [ "$N" -gt 250 ]; then
  echo "netns.sh: N must be a number from 2 to 250, not '$N'" >&2
  exit 2
fi
[ "$(id -u)" = 0 ] || { echo "netns.sh: must run as root" >&2; exit 1; }
command -v ip >/dev/null || { echo "netns.sh: ip (iproute2) is missing" >&2; exit 1; }

host_ok() { # I: namespace ew-hI has 10.77.0.I on eth0, the link up, the multicast route
  # (a run stopped in the middle of a test that cuts a host's link leaves it down)
  ip -n "ew-h$1" -4 -o addr show dev eth0 2>/dev/null | grep -q " 10\.77\.0\.$1/24 " &&
    ip -n "ew-h$1" link show dev eth0 2>/dev/null | grep -q "state UP" &&
    ip -n "ew-h$1" route show 224.0.0.0/4 2>/dev/null | grep -q "dev eth0"
}
present=$(ip netns list | awk '$1 ~ /^ew-(h[0-9]+|br)$/ {print $1}' | sort | tr '\n' ' ')
wanted=$( { echo $BR; for i in $(seq 1 "$N"); do echo "ew-h$i"; done; } | sort | tr '\n' ' ')
if [ "$present" = "$wanted" ]; then
  ok=1
  for i in $(seq 1 "$N"); do host_ok "$i" || ok=0; done
  if [ $ok = 1 ]; then
    echo "netns: already running ($N hosts ew-h1..ew-h$N at 10.77.0.1..$N, bridge in $BR)"
    exit 0
  fi
fi
if [ -n "$present" ]; then
  echo "rebuilding: found '$present' (or a host's link down), want '$wanted'"
  "$HERE/netns-down.sh"
fi

echo "creating bridge namespace $BR and hosts ew-h1..ew-h$N"
ip netns add $BR
ip -n $BR link set lo up
ip -n $BR link add br0 type bridge
ip -n $BR link set br0 type bridge mcast_snooping 0
ip -n $BR link set br0 up
for i in $(seq 1 "$N"); do
  h=ew-h$i
  ip netns add "$h"
  ip -n "$h" link set lo up
  ip -n $BR link add "v$i" type veth peer name eth0 netns "$h"
  ip -n $BR link set "v$i" master br0 up
  ip -n "$h" addr add "10.77.0.$i/24" dev eth0
  ip -n "$h" link set eth0 up
  ip -n "$h" route add 224.0.0.0/4 dev eth0
done

# Prove multicast once, inside the namespaces: ew-h1 sends, ew-h2 receives.
PY=$(command -v python3 >/dev/null && python3 -c 'import sys; print(sys.executable)' 2>/dev/null || echo /usr/bin/python3)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
ip netns exec ew-h2 timeout 10 "$PY" -c '
import socket, struct, sys
g, p = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((g, p))
s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, struct.pack("4s4s", socket.inet_aton(g), socket.inet_aton("10.77.0.2")))
s.settimeout(5)
print("READY", flush=True)
data, src = s.recvfrom(100)
print("GOT", data.decode(), src[0], flush=True)
' $GROUP $PORT >"$W/recv" 2>&1 &
recv=$!
deadline=$((SECONDS + 10))
until grep -q READY "$W/recv" || [ "$SECONDS" -ge "$deadline" ]; do sleep 0.05; done
ip netns exec ew-h1 timeout 10 "$PY" -c '
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
for _ in range(20):
    s.sendto(b"hello", (sys.argv[1], int(sys.argv[2])))
    time.sleep(0.05)
' $GROUP $PORT 2>&1 &
send=$!
rc=0
wait $recv || rc=$?
kill "$send" 2>/dev/null || true
wait "$send" 2>/dev/null || true
if [ $rc != 0 ] || ! grep -q "GOT hello 10.77.0.1" "$W/recv"; then
  echo "netns.sh: multicast from ew-h1 did not reach ew-h2: $(cat "$W/recv")" >&2
  exit 1
fi
echo "netns: started ($N hosts ew-h1..ew-h$N at 10.77.0.1..$N, bridge in $BR, multicast checked)"
