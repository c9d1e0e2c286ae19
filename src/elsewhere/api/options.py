"""The options of the public functions and cluster constructors, for type checkers.

``ew.submit(f, xs, retries=2)``, ``ew.local(idle_timeout_s=60)`` and ``ew.slurm(mem="4G")`` take
their options as keyword arguments checked at run time (an unknown one is a ConfigError that
lists the known ones). The TypedDicts here describe the same options to mypy, pyright and IDEs
(``**options: Unpack[SlurmOptions]``), so that a misspelt option or a value of the wrong type is
found before a job is submitted. Importing this module is never needed at run time.

Each TypedDict mirrors a signature (``create_job``, ``LocalCluster``, ``SSHCluster``,
``PeerCluster``, ``BatchCluster``); tests/typing checks that they name the same options.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from ..util.retry import Retry
    from .job import Job

__all__ = [
    "BatchOptions",
    "BsubOptions",
    "FluxOptions",
    "JobOptions",
    "LocalOptions",
    "PeerOptions",
    "QsubOptions",
    "SSHOptions",
    "SlurmOptions",
]


class JobOptions(TypedDict, total=False):
    """The options of :func:`elsewhere.create_job`, which ``ew.submit``, ``ew.map``,
    ``ew.submit_communicating`` and ``ew.Executor`` pass on (see ``create_job`` for what
    each means)."""

    tag: str
    seed: int | None
    retries: int | Retry
    after: Job[Any] | str | Iterable[Job[Any] | str] | None
    files: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None
    job_data: Any
    env: dict[str, str] | None
    storage: str | os.PathLike[str] | None


class _ClusterOptions(TypedDict, total=False):
    """What every cluster takes (:class:`elsewhere.Cluster`)."""

    cores_per_task: int
    storage: str | Path | None
    additional_properties: dict[str, Any] | None


class LocalOptions(_ClusterOptions, total=False):
    """The options of ``ew.local(cores, ...)``: worker processes on this machine."""

    idle_timeout_s: float
    python: str | Sequence[str] | None


class SSHOptions(_ClusterOptions, total=False):
    """The options of ``ew.ssh(nodes, ...)``: workers on hosts reached over ssh."""

    python: str | Sequence[str] | Mapping[str, str | Sequence[str]] | None
    remote_storage: str | dict[str, str]
    setup: str | None
    ssh_options: list[str] | tuple[str, ...]
    ssh_config: str | None
    host_timeout_s: float


class PeerOptions(_ClusterOptions, total=False):
    """The options of ``ew.peers(group, ...)``: the peer network of workstations."""

    key: str | os.PathLike[str] | None
    memory: str | int | None
    time: str | float | None
    peers: list[Any] | tuple[Any, ...]
    port: int | None
    multicast_group: str | None
    interface: str | None
    diary: str
    prefer_local: bool
    encrypt: bool
    detach: bool | None


class BatchOptions(_ClusterOptions, total=False):
    """The options every batch scheduler takes (``ew.batch("htcondor", ...)``); see
    :class:`elsewhere.backends.batch.BatchCluster` for what each means."""

    queue: str | None
    partition: str | None
    account: str | None
    qos: str | None
    walltime: str | int | None
    mem: str | int | None
    mem_per_core: str | int | None
    gpus: int
    tasks_per_element: int | None
    max_elements: int
    max_running: int | None
    template: str | None
    env_setup: list[str] | tuple[str, ...]
    extra_args: list[str] | tuple[str, ...]
    python: str | Sequence[str] | None
    host: str | None
    remote_storage: str | None
    ssh_options: list[str] | tuple[str, ...]
    ssh_config: str | None
    status_interval_s: float
    syntax_options: dict[str, Any] | None
    launcher: str | None


class SlurmOptions(BatchOptions, total=False):
    """The options of ``ew.slurm(...)``: those of every batch scheduler, and ``sbatch=[...]``
    (words added to the ``sbatch`` command)."""

    sbatch: list[str] | tuple[str, ...]


class QsubOptions(BatchOptions, total=False):
    """The options of ``ew.batch("sge" | "pbs" | "torque" | "slurm-torque", ...)``: those of
    every batch scheduler, and ``qsub=[...]`` (words added to the ``qsub`` command)."""

    qsub: list[str] | tuple[str, ...]


class BsubOptions(BatchOptions, total=False):
    """The options of ``ew.batch("lsf", ...)``: those of every batch scheduler, and
    ``bsub=[...]`` (words added to the ``bsub`` command)."""

    bsub: list[str] | tuple[str, ...]


class FluxOptions(BatchOptions, total=False):
    """The options of ``ew.batch("flux", ...)``: those of every batch scheduler, and
    ``flux=[...]`` (words added to the ``flux submit`` command)."""

    flux: list[str] | tuple[str, ...]
