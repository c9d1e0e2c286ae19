"""The built-in batch schedulers: each is the shared base plus its syntax.

See :mod:`elsewhere.backends.batch` for what they share and
:mod:`elsewhere.schedulers` for what differs (states, templates, commands).
"""

from __future__ import annotations

from .batch import BatchCluster


class SlurmCluster(BatchCluster):
    """SLURM: one ``sbatch --array`` per job; ``sbatch=[...]`` adds options.

    Communicating jobs start their ranks with ``srun --mpi=pmix`` (set
    ``launcher=`` for a site whose MPI needs another plugin, or "mpiexec").
    """

    kind = "slurm"

    def __init__(self, **settings: object) -> None:
        settings.setdefault("launcher", "srun --mpi=pmix")
        super().__init__(**settings)  # type: ignore[arg-type]


class SGECluster(BatchCluster):
    """Son of Grid Engine / Grid Engine: ``qsub -t``; ``qsub=[...]`` adds options."""

    kind = "sge"


class PBSCluster(BatchCluster):
    """OpenPBS / PBS Pro: ``qsub -J``; ``qsub=[...]`` adds options."""

    kind = "pbs"


class TorqueCluster(BatchCluster):
    """Torque: ``qsub -t``; ``qsub=[...]`` adds options."""

    kind = "torque"


class SlurmTorqueCluster(BatchCluster):
    """PBS-style commands over SLURM (Debian's slurm-wlm-torque wrappers)."""

    kind = "slurm-torque"


class LSFCluster(BatchCluster):
    """IBM Spectrum LSF: ``bsub -J "name[1-N]"``; ``bsub=[...]`` adds options."""

    kind = "lsf"


class HTCondorCluster(BatchCluster):
    """HTCondor: ``condor_submit`` with ``queue N``."""

    kind = "htcondor"


class FluxCluster(BatchCluster):
    """Flux: ``flux submit --cc``; ``flux=[...]`` adds options."""

    kind = "flux"
