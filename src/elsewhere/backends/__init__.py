"""Backends: where tasks run.

Built-in kinds are looked up by name; a user's own scheduler is a class
registered under the entry-point group ``elsewhere.schedulers`` or named by
``"module:Class"`` (in a profile, ``scheduler = "mypkg.sched:MyScheduler"``).
"""

from __future__ import annotations

import importlib
from typing import Any

from ..util.errors import ConfigError
from .base import Cluster, ensure_post_constructed

_BUILTIN = {
    "local": "elsewhere.backends.local:LocalCluster",
    "ssh": "elsewhere.backends.ssh:SSHCluster",
    "peer": "elsewhere.backends.peer:PeerCluster",
    "slurm": "elsewhere.backends.schedulers:SlurmCluster",
    "sge": "elsewhere.backends.schedulers:SGECluster",
    "pbs": "elsewhere.backends.schedulers:PBSCluster",
    "torque": "elsewhere.backends.schedulers:TorqueCluster",
    "slurm-torque": "elsewhere.backends.schedulers:SlurmTorqueCluster",
    "lsf": "elsewhere.backends.schedulers:LSFCluster",
    "htcondor": "elsewhere.backends.schedulers:HTCondorCluster",
    "flux": "elsewhere.backends.schedulers:FluxCluster",
}


def register_builtin(kind: str, target: str) -> None:
    """Name a built-in backend (used by backend modules of this package)."""
    _BUILTIN[kind] = target


def _load(target: str) -> type[Cluster]:
    mod, _, attr = target.partition(":")
    try:
        obj = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load the cluster class {target!r}: {exc}") from exc
    if not (isinstance(obj, type) and issubclass(obj, Cluster)):
        raise ConfigError(f"{target!r} is not a subclass of elsewhere.Cluster")
    return obj


def cluster_class(kind: str) -> type[Cluster]:
    """The class of a backend: built-in name, entry point, or "module:Class"."""
    if not isinstance(kind, str):
        raise ConfigError(f"a cluster kind is a name such as 'slurm' or 'pbs' (built in: {', '.join(sorted(_BUILTIN))}), "
                          f"an entry point's name, or 'module:Class', not {kind!r}")  # fmt: skip
    if kind in _BUILTIN:
        return _load(_BUILTIN[kind])
    if ":" in kind:
        return _load(kind)
    from importlib.metadata import entry_points

    for ep in entry_points(group="elsewhere.schedulers"):
        if ep.name == kind:
            cls = ep.load()
            if isinstance(cls, type) and issubclass(cls, Cluster):
                return cls
            if isinstance(cls, type) and hasattr(cls, "build_submit") and hasattr(cls, "parse_status"):
                # A scheduler syntax alone: the shared batch base does the rest.
                from .batch import BatchCluster

                return type(f"{cls.__name__}Cluster", (BatchCluster,), {"kind": kind, "syntax_name": kind})
            raise ConfigError(
                f"entry point {kind!r} of elsewhere.schedulers is neither a Cluster subclass "
                "nor a scheduler syntax (see elsewhere.schedulers.syntax)")
    import sys

    plugins = sorted(ep.name for ep in entry_points(group="elsewhere.schedulers"))
    raise ConfigError(
        f"unknown cluster kind {kind!r}: not built in ({', '.join(sorted(_BUILTIN))}), and no entry point "
        f"of that name in the group 'elsewhere.schedulers' of the packages installed for {sys.executable} "
        f"({', '.join(plugins) if plugins else 'none there'}); install the plugin's package into that "
        "interpreter, or name its class as 'module:Class'")


def from_description(desc: dict[str, Any], *, check: bool = False) -> Cluster:
    """Rebuild a cluster from ``Cluster.describe()``; ``check``: run its ``post_construct``
    (not when it is rebuilt only to read a job)."""
    desc = dict(desc)
    kind = desc.pop("kind")
    target = desc.pop("class", None)
    try:
        cls = cluster_class(kind)
    except ConfigError:
        if not target:
            raise
        cls = _load(target)  # a plugin named by module path when the job was made
    cluster = cls.from_settings(desc)
    return ensure_post_constructed(cluster) if check else cluster


__all__ = ["Cluster", "cluster_class", "ensure_post_constructed", "from_description", "register_builtin"]
