#!/usr/bin/env bash
# Task Spooler (tsp), the real queue behind the example scheduler plugin (examples/tsp_scheduler.py,
# tests/batch/test_tsp_plugin.py). Nothing to start: each test runs a tsp server of its own
# (TS_SOCKET under its tmp_path). This proves the command runs one job and reports it.
#
# Usage: tsp.sh [--packages]
set -euo pipefail

if [ "${1:-}" = --packages ]; then
  echo task-spooler
  exit 0
fi
command -v tsp >/dev/null || { echo "tsp.sh: tsp is missing; on Debian as root: apt-get install task-spooler" >&2; exit 1; }
W=$(mktemp -d)
export TS_SOCKET=$W/socket TMPDIR=$W
trap 'tsp -K >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
id=$(tsp echo "tsp runs")
timeout 30 tsp -w "$id" >/dev/null 2>&1 || true
grep -q "tsp runs" "$(tsp -o "$id")" || { echo "tsp.sh: tsp ran no job" >&2; exit 1; }
echo "tsp: ready (task-spooler $(dpkg-query -W -f='${Version}' task-spooler 2>/dev/null || echo '?'))"
