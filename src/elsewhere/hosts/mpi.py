"""MPI launchers: which ``mpiexec`` to run, with what flags, and whether mpi4py is there.

Used by the backends that start a communicating job's ranks on a host they reach
(``ew.local()`` runs mpiexec here; batch schedulers use their own launchers in the job script).
"""

from __future__ import annotations

import importlib.util
import os
import shutil

from ..util.errors import ConfigError

INSTALL_MPI = (
    "install an MPI and mpi4py: on Debian/Ubuntu `apt-get install openmpi-bin libopenmpi-dev`, "
    "then `pip install mpi4py` (or `conda install -c conda-forge mpi4py openmpi`)"
)


def find_launcher(launcher: str | None = None) -> list[str]:
    """The launcher command as words; ConfigError saying what to install when missing."""
    words = (launcher or "mpiexec").split()
    if shutil.which(words[0]) is None:
        raise ConfigError(f"no MPI launcher {words[0]!r} on PATH: {INSTALL_MPI}")
    return words


def check_mpi4py() -> None:
    """ConfigError when mpi4py is not importable by this interpreter."""
    if importlib.util.find_spec("mpi4py") is None:
        raise ConfigError(f"mpi4py is not installed for this Python: {INSTALL_MPI}")


def launcher_argv(launcher: list[str], ranks: int, extra: list[str], *, oversubscribe: bool) -> list[str]:
    """mpiexec's words for ``ranks`` ranks (Open MPI's flags for root and oversubscription)."""
    argv = [*launcher, "-n", str(ranks)]
    name = os.path.basename(launcher[0])
    if name in ("mpiexec", "mpirun", "orterun") and _is_open_mpi(launcher[0]):
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        if oversubscribe:
            argv.append("--oversubscribe")
    return [*argv, *extra]


def _is_open_mpi(path: str) -> bool:
    real = os.path.realpath(shutil.which(path) or path)
    return "openmpi" in real or os.path.basename(real) in ("orterun", "prterun")
