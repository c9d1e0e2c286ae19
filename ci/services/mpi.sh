#!/usr/bin/env bash
# MPI for the tests: Open MPI 4.1 from Debian (openmpi-bin, libopenmpi-dev: installed by up.sh,
# `mpi.sh --packages` lists them) and mpi4py in the project's venv (pip; a binary wheel that
# finds the system's libmpi). No daemon.
#
# As root, Open MPI's mpiexec refuses to run unless told it may, and it refuses more ranks than
# cores (2 here) unless told to oversubscribe. Either pass
#     mpiexec --allow-run-as-root --oversubscribe -n 4 ...
# or set, e.g. for a test's subprocess,
#     OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# (tests/services.py: mpi().env and mpi().mpiexec_args). Under SLURM use `srun --mpi=pmix`.
#
# Usage: mpi.sh [--packages]      Environment: ELSEWHERE_CI_VENV (default: the repo's .venv)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${ELSEWHERE_CI_VENV:-$REPO/.venv}

if [ "${1:-}" = --packages ]; then
  echo openmpi-bin libopenmpi-dev
  exit 0
fi
command -v mpiexec >/dev/null || { echo "mpi.sh: mpiexec is missing: run ci/services/up.sh mpi" >&2; exit 1; }
ompi=$(mpiexec --version 2>/dev/null | head -1)
[ -x "$VENV/bin/python" ] || { echo "mpi.sh: no venv at $VENV (scripts/test makes it)" >&2; exit 1; }

if version=$("$VENV/bin/python" -c 'import mpi4py; print(mpi4py.__version__)' 2>/dev/null); then
  echo "mpi: already installed ($ompi; mpi4py $version in $VENV)"
  exit 0
fi
echo "installing mpi4py into $VENV"
timeout 600 "$VENV/bin/pip" install -q mpi4py
version=$("$VENV/bin/python" -c 'import mpi4py; print(mpi4py.__version__)')
# one real start of MPI (no mpiexec: a singleton) proves the wheel found libmpi
"$VENV/bin/python" -c 'from mpi4py import MPI; assert MPI.COMM_WORLD.Get_size() == 1' \
  || { echo "mpi.sh: mpi4py $version imports but MPI does not initialise" >&2; exit 1; }
echo "mpi: installed ($ompi; mpi4py $version in $VENV)"
