#!/usr/bin/env bash
# Remove the test hosts of netns.sh: every namespace ew-h<N> and the bridge namespace ew-br.
# Deleting a namespace removes its veth ends and the bridge. Processes still running inside are
# NOT killed (only their starters may end them): they are listed, and keep their namespace alive
# without a name until they exit.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "netns-down.sh: must run as root" >&2; exit 1; }
for ns in $(ip netns list | awk '$1 ~ /^ew-(h[0-9]+|br)$/ {print $1}'); do
  pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
  [ -n "$pids" ] && echo "warning: processes still in $ns: $pids"
  ip netns del "$ns"
  echo "deleted $ns"
done
echo "netns: down"
