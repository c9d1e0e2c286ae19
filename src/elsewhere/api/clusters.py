"""The cluster constructors: ``ew.local``, ``ew.ssh``, ``ew.peers``, ``ew.slurm``, ``ew.batch``
and ``ew.cluster`` (a profile), and how ``on=`` becomes a cluster.

Each passes its settings to its backend's class, which checks them (an unknown or ill-typed
setting is a ConfigError); for type checkers the settings are typed by the TypedDicts of
``options.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

from ..backends.base import Cluster, ensure_post_constructed
from ..util.errors import ConfigError

if TYPE_CHECKING:  # the settings as type checkers see them (not imported at run time)
    import sys

    if sys.version_info >= (3, 11):
        from typing import Unpack
    else:
        from typing_extensions import Unpack

    from .options import (
        BatchOptions,
        BsubOptions,
        FluxOptions,
        LocalOptions,
        PeerOptions,
        QsubOptions,
        SlurmOptions,
        SSHOptions,
    )

__all__ = ["batch", "cluster", "local", "peers", "resolve", "slurm", "ssh"]


def local(cores: int | None = None, **options: Unpack[LocalOptions]) -> Cluster:
    """Worker processes on this machine (the default cluster).

    ``cores``: how many cores a job may use (default: the free ones);
    ``cores_per_task``: cores each task gets; ``idle_timeout_s``: how long
    workers stay warm after a job.
    """
    from ..backends.local import LocalCluster

    return ensure_post_constructed(LocalCluster(cores, **options))


def ssh(
    nodes: list[str] | tuple[str, ...] | dict[str, int] | str, **settings: Unpack[SSHOptions]
) -> Cluster:
    """Workers on hosts reached over ssh (dMod2's sshNodes).

    ``ew.ssh(["server1", "user@server2"])`` uses every node's free cores;
    ``ew.ssh({"server1": 24, "server2": 20})`` at most that many. Settings:
    cores_per_task, python (one, or a dict per node), remote_storage, setup,
    ssh_options, ssh_config, host_timeout_s.
    """
    from ..backends.ssh import SSHCluster

    return ensure_post_constructed(SSHCluster(nodes, **settings))


def peers(group: str | None = None, **settings: Unpack[PeerOptions]) -> Cluster:
    """The peer network (FieldTrip's peercellfun): workstations running ``elsewhere peer worker``.

    ``group`` and ``key`` name the group (without a key: this machine only,
    over loopback); ``memory`` and ``time`` say what each task needs; ``peers``
    lists addresses where multicast discovery is not allowed.
    """
    from ..backends.peer import PeerCluster

    return ensure_post_constructed(PeerCluster(group, **settings))


def slurm(**settings: Unpack[SlurmOptions]) -> Cluster:
    """A SLURM cluster: ``ew.slurm(partition="debug", cores_per_task=4, walltime="01:00:00")``.

    Settings are those of :class:`elsewhere.backends.batch.BatchCluster`
    (queue/partition, account, qos, walltime, mem, gpus, tasks_per_element,
    max_running, template, env_setup, python, host, remote_storage, sbatch=[...]).
    """
    from ..backends.schedulers import SlurmCluster

    return ensure_post_constructed(SlurmCluster(**settings))


@overload
def batch(scheduler: Literal["slurm"], **settings: Unpack[SlurmOptions]) -> Cluster: ...
@overload
def batch(
    scheduler: Literal["sge", "pbs", "torque", "slurm-torque"], **settings: Unpack[QsubOptions]
) -> Cluster: ...
@overload
def batch(scheduler: Literal["lsf"], **settings: Unpack[BsubOptions]) -> Cluster: ...
@overload
def batch(scheduler: Literal["flux"], **settings: Unpack[FluxOptions]) -> Cluster: ...
@overload
def batch(scheduler: Literal["htcondor"], **settings: Unpack[BatchOptions]) -> Cluster: ...
@overload
def batch(scheduler: str, **settings: Any) -> Cluster: ...  # a plugin's: its own options
def batch(scheduler: str, **settings: Any) -> Cluster:
    """Any batch scheduler by name: "slurm", "sge", "pbs", "torque", "lsf", "htcondor", "flux",
    or a user's own registered under the entry-point group ``elsewhere.schedulers``."""
    from ..backends import cluster_class

    return ensure_post_constructed(cluster_class(scheduler)(**settings))


def cluster(name: str, **overrides: Any) -> Cluster:
    """The cluster a profile describes (``[profiles.NAME]`` in config.toml)."""
    from .profiles import load_profile

    return ensure_post_constructed(load_profile(name, **overrides))


def resolve(on: Cluster | str | None) -> Cluster:
    """The cluster ``on=`` names: a cluster (post-constructed once), a profile's name, or
    "local" and None (both ``ew.local()``)."""
    if on is None:
        return local()
    if isinstance(on, Cluster):
        return ensure_post_constructed(on)
    if isinstance(on, str):
        if on == "local":
            return local()
        return cluster(on)
    raise ConfigError(f"on= takes a cluster (e.g. ew.local()) or a profile name, not {on!r}")
