"""Where elsewhere keeps things on this machine.

Everything lives under one *home* folder: ``$ELSEWHERE_HOME`` when set, else
the user data directory (``platformdirs.user_data_dir("elsewhere")``)::

    <home>/jobs/<job id>/     job folders (the default storage location)
    <home>/registry.sqlite    the registry of jobs (name -> folder, state)
    <home>/local/<pool>/      warm local worker processes (see clusters/local.py)

Configuration (profiles, job-script templates, peer keys) lives in the user
config directory, or ``$ELSEWHERE_CONFIG`` when set.
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """The folder that holds job storage, the registry and the local pool."""
    env = os.environ.get("ELSEWHERE_HOME")
    if env:
        return Path(env).expanduser().absolute()
    import platformdirs

    return Path(platformdirs.user_data_dir("elsewhere", appauthor=False))


def config_dir() -> Path:
    """The folder that holds ``config.toml``, templates and peer keys."""
    env = os.environ.get("ELSEWHERE_CONFIG")
    if env:
        return Path(env).expanduser().absolute()
    import platformdirs

    return Path(platformdirs.user_config_dir("elsewhere", appauthor=False))


def default_storage() -> Path:
    """Where job folders go unless a call or a cluster names another place."""
    return home() / "jobs"


def registry_path() -> Path:
    """The SQLite file of the job registry."""
    return home() / "registry.sqlite"
