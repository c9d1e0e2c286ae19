"""Profiles: named clusters in ``<config>/config.toml``.

    [profiles.helix]
    scheduler = "slurm"            # or "local", "ssh", "sge", "module.path:Class", an entry point
    partition = "debug"
    walltime = "01:00:00"
    python = "module load python/3.11; python3"
    [profiles.helix.additional_properties]
    constraint = "skylake"

``on="helix"`` or ``ew.cluster("helix")`` builds that cluster; keyword
arguments given to ``ew.cluster`` override the profile's settings.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..backends import cluster_class
from ..backends.base import Cluster
from ..util import paths
from ..util.errors import ConfigError, ProfileNotFound


def config_file() -> Path:
    """The configuration file: ``<config>/config.toml``."""
    return paths.config_dir() / "config.toml"


def read_profiles(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every ``[profiles.NAME]`` table of the configuration file."""
    path = path or config_file()
    if not path.is_file():
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict):
        raise ConfigError(f"{path}: [profiles] must be a table of tables")
    return profiles


def load_profile(name: str, **overrides: Any) -> Cluster:
    """The cluster that profile ``name`` describes."""
    profiles = read_profiles()
    if name not in profiles:
        known = ", ".join(sorted(profiles)) or "none"
        raise ProfileNotFound(f"no profile {name!r} in {config_file()} (profiles there: {known})")
    settings = dict(profiles[name])
    settings.update(overrides)
    kind = settings.pop("scheduler", None) or settings.pop("kind", None)
    if not kind:
        raise ConfigError(f"profile {name!r} in {config_file()} names no scheduler (scheduler = \"slurm\", ...)")
    cls = cluster_class(str(kind))
    try:
        return cls(**settings)
    except TypeError as exc:
        raise ConfigError(f"profile {name!r}: {exc}") from exc
