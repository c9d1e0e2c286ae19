#!/usr/bin/env bash
# podman for the python= container tests (tests/env): Debian's podman, run with runc. No daemon.
#
# No image can be pulled here (no registry but the package ones), so a container runs from a
# root file system made of the host's /usr (`podman run --rootfs DIR`, /usr bound read-only),
# as tests/env/env_wrappers.py does. On this kind of VM (hybrid cgroups, a low open-files
# cap) crun refuses to start anything, and runc needs limits within the caller's: the flags
# below are the ones that work. One container that prints a line proves podman runs here.
#
# Usage: podman.sh [--packages]
set -euo pipefail

if [ "${1:-}" = --packages ]; then
  echo podman runc
  exit 0
fi

said="already installed"
if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
  if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
    echo "podman.sh: podman or runc is missing; on Debian as root: apt-get install podman runc" >&2
    exit 1
  fi
  echo "installing podman and runc (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  timeout 300 apt-get update -q >/dev/null
  timeout 900 apt-get install -y -q --no-install-recommends podman runc >/dev/null
  said="installed"
fi
version=$(podman --version 2>/dev/null | head -1)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/root/usr" "$W/root/etc" "$W/root/proc" "$W/root/sys" "$W/root/dev" "$W/root/tmp"
for l in bin lib lib64 sbin; do ln -s "usr/$l" "$W/root/$l"; done
if ! out=$(timeout 120 podman --runtime runc run --rm --ulimit nofile=1024:4096 --ulimit nproc=4096:4096 \
  --pid host --network host -v /usr:/usr:ro --rootfs "$W/root" /bin/echo "podman runs" 2>"$W/err" </dev/null); then
  echo "podman.sh: $version started no container; its stderr ends:" >&2
  tail -n 5 "$W/err" >&2
  exit 1
fi
[[ $out == *"podman runs"* ]] || { echo "podman.sh: $version printed nothing from a container" >&2; exit 1; }
echo "podman: $said ($version with runc; runs a container from a rootfs)"
