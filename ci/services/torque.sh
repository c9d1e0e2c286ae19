#!/usr/bin/env bash
# PBS/Torque command line for the tests: Debian's slurm-wlm-torque wrappers (qsub, qstat, qdel,
# qalter, qhold, qrls, qrerun, pbsnodes, generate_pbs_nodefile: Perl scripts that drive the real
# SLURM of slurm.sh) unpacked into /opt/elsewhere-ci/torque/bin, NOT installed as a package:
# the package conflicts with gridengine-client (both ship /usr/bin/qsub). Tests that want PBS
# put that folder first on PATH; everything else keeps SGE's qsub.
#
# The wrappers call "$(dirname qsub)/sbatch" (FindBin), so the folder also links sbatch, salloc
# and srun to /usr/bin. Left out: mpiexec.slurm (it would shadow Open MPI's mpiexec).
# The Perl modules they use (libslurm-perl, libslurmdb-perl, libswitch-perl) do not conflict and
# are installed by up.sh (`torque.sh --packages`). The version unpacked follows slurm-client's.
#
# Usage: torque.sh [--packages]
set -euo pipefail

DEST=${ELSEWHERE_CI_TORQUE_DIR:-/opt/elsewhere-ci/torque}
TOOLS=(qsub qstat qdel qalter qhold qrls qrerun pbsnodes generate_pbs_nodefile)

if [ "${1:-}" = --packages ]; then
  echo libslurm-perl libslurmdb-perl libswitch-perl slurm-client
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "torque.sh: must run as root" >&2; exit 1; }
command -v sbatch >/dev/null || { echo "torque.sh: slurm-client is missing: run ci/services/up.sh torque" >&2; exit 1; }

version=$(dpkg-query -W -f='${Version}' slurm-client)
if [ "$(cat "$DEST/version" 2>/dev/null)" = "$version" ] && [ -x "$DEST/bin/qsub" ]; then
  echo "torque: already installed (slurm-wlm-torque $version in $DEST/bin)"
  exit 0
fi

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
echo "downloading slurm-wlm-torque=$version (not installed: unpacked into $DEST)"
if ! (cd "$W" && timeout 120 apt-get download -q "slurm-wlm-torque=$version" >/dev/null 2>&1); then
  # the package lists may be older than the mirror: refresh once and retry
  echo "apt-get download failed: apt-get update, then retry"
  timeout 300 apt-get update -q >/dev/null
  (cd "$W" && timeout 120 apt-get download -q "slurm-wlm-torque=$version")
fi
rm -rf "$DEST"
mkdir -p "$DEST/root" "$DEST/bin"
dpkg -x "$W"/slurm-wlm-torque_*.deb "$DEST/root"
for t in "${TOOLS[@]}"; do
  install -m 755 "$DEST/root/usr/bin/$t" "$DEST/bin/$t"
done
for t in sbatch salloc srun; do ln -sf "/usr/bin/$t" "$DEST/bin/$t"; done
perl -e 'use Slurm; use Slurmdb; use Switch;' 2>/dev/null \
  || { echo "torque.sh: Perl modules missing (Slurm, Slurmdb, Switch): run ci/services/up.sh torque" >&2; exit 1; }
if ! err=$(perl -c "$DEST/bin/qsub" 2>&1); then
  echo "torque.sh: $DEST/bin/qsub does not compile: $err" >&2
  exit 1
fi
echo "$version" >"$DEST/version"
echo "torque: installed (slurm-wlm-torque $version in $DEST/bin; use PATH=$DEST/bin:\$PATH)"
