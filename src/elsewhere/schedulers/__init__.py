"""The pure, per-scheduler parts of elsewhere's batch clusters.

Each module describes one batch scheduler as a class with no state besides
its configuration: a table of native states, a job-script template, command
builders and output parsers (see :mod:`elsewhere.schedulers.syntax` for the
protocol). Nothing here runs a command. What the schedulers share has a module
per concept: ``syntax`` (the protocol and its base class), ``context`` (the
template's fields), ``status`` (what a status parser returns), ``capacity`` (what the
free-CPU query returns), ``indices``
(index ranges), ``resources`` (walltime and memory in the units schedulers
take, read by the one grammar of :mod:`elsewhere.util.units`), ``jobscripts``
(finding a user's template).

Built in, by registry key:

=================  ==========================================================
``slurm``          :class:`SlurmSyntax` (sbatch --array, squeue, sacct)
``sge``            :class:`SGESyntax` (qsub -t, qstat -xml, qacct)
``pbs``            :class:`PBSSyntax` (variant ``openpbs`` by default)
``openpbs``        ``PBSSyntax(variant="openpbs")`` (qsub -J, qstat -F json)
``torque``         ``PBSSyntax(variant="torque")`` (qsub -t, qstat -f -t)
``slurm-torque``   :class:`SlurmTorqueSyntax` (Debian's qsub wrapper; squeue/sacct/scancel to follow)
``lsf``            :class:`LSFSyntax` (bsub -J "name[1-N]", bjobs -o, bhist)
``htcondor``       :class:`HTCondorSyntax` (condor_submit queue N, condor_q -af)
``flux``           :class:`FluxSyntax` (flux submit --cc, flux jobs)
=================  ==========================================================

A user's own scheduler is a class registered under the entry-point group
``elsewhere.schedulers``; :func:`get_syntax` finds it by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

from elsewhere.schedulers.capacity import FreeCpus
from elsewhere.schedulers.context import ScriptContext
from elsewhere.schedulers.flux import FluxSyntax
from elsewhere.schedulers.htcondor import HTCondorSyntax
from elsewhere.schedulers.indices import compress_indices, expand_indices, split_array_first
from elsewhere.schedulers.lsf import LSFSyntax
from elsewhere.schedulers.pbs import PBSSyntax, SlurmTorqueSyntax
from elsewhere.schedulers.resources import (
    format_walltime,
    format_walltime_hm,
    parse_memory_mb,
    parse_walltime,
)
from elsewhere.schedulers.sge import SGESyntax
from elsewhere.schedulers.slurm import SlurmSyntax
from elsewhere.schedulers.status import NativeStatus
from elsewhere.schedulers.syntax import BatchSyntax, SchedulerSyntax, load_template
from elsewhere.util.errors import ConfigError

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "BatchSyntax",
    "FluxSyntax",
    "FreeCpus",
    "HTCondorSyntax",
    "LSFSyntax",
    "NativeStatus",
    "PBSSyntax",
    "SGESyntax",
    "SchedulerSyntax",
    "ScriptContext",
    "SlurmSyntax",
    "SlurmTorqueSyntax",
    "available",
    "compress_indices",
    "expand_indices",
    "format_walltime",
    "format_walltime_hm",
    "get_syntax",
    "load_template",
    "parse_memory_mb",
    "parse_walltime",
    "split_array_first",
]

#: entry-point group under which other packages register scheduler classes
ENTRY_POINT_GROUP = "elsewhere.schedulers"


def _pbs(variant: str) -> Callable[..., SchedulerSyntax]:
    def make(**config: Any) -> SchedulerSyntax:
        return PBSSyntax(variant=config.pop("variant", variant), **config)

    return make


#: registry key -> factory (a class, or a function taking the configuration)
BUILTIN: Mapping[str, Callable[..., SchedulerSyntax]] = MappingProxyType(
    {
        "slurm": SlurmSyntax,
        "sge": SGESyntax,
        "pbs": PBSSyntax,
        "openpbs": _pbs("openpbs"),
        "torque": _pbs("torque"),
        "slurm-torque": SlurmTorqueSyntax,
        "lsf": LSFSyntax,
        "htcondor": HTCondorSyntax,
        "flux": FluxSyntax,
    }
)


def available() -> list[str]:
    """Names :func:`get_syntax` knows: the built-in ones and registered entry points."""
    names = set(BUILTIN)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def get_syntax(name: str, **config: Any) -> SchedulerSyntax:
    """The scheduler syntax registered as ``name``, built with ``config``.

    Built-in names first, then the ``elsewhere.schedulers`` entry points.
    Raises :class:`ConfigError` for an unknown name or a bad configuration.
    """
    key = name.strip().lower()
    factory: Callable[..., SchedulerSyntax] | None = BUILTIN.get(key)
    if factory is None:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name == key:
                try:
                    factory = ep.load()
                except Exception as exc:
                    raise ConfigError(
                        f"scheduler {name!r}: cannot load entry point {ep.value}: {exc}"
                    ) from exc
                break
    if factory is None:
        raise ConfigError(f"unknown scheduler {name!r}; known: {', '.join(available())}")
    try:
        syntax = factory(**config)
    except TypeError as exc:
        raise ConfigError(f"scheduler {name!r}: bad configuration {config!r}: {exc}") from exc
    if not isinstance(syntax, SchedulerSyntax):
        raise ConfigError(f"scheduler {name!r}: {factory!r} does not implement SchedulerSyntax")
    return syntax
