"""Job-script templates: the user's own (config dir) and the built-in ones.

A user keeps templates in ``<config>/templates/NAME.j2`` (dMod2's
``slurmTemplate``); ``template="NAME"`` on a batch cluster picks one, a
string with a newline is the template text itself. ``elsewhere template``
lists, shows, installs and opens them.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from ..util import paths
from ..util.errors import ConfigError


def user_dir() -> Path:
    """The folder of the user's own templates."""
    return paths.config_dir() / "templates"


def builtin_names() -> list[str]:
    """Names of the built-in templates (one per scheduler)."""
    root = importlib.resources.files("elsewhere.schedulers").joinpath("templates")
    return sorted(p.name[:-3] for p in root.iterdir() if p.name.endswith(".j2"))


def builtin_text(name: str) -> str:
    """The text of a built-in template."""
    root = importlib.resources.files("elsewhere.schedulers").joinpath("templates")
    res = root.joinpath(f"{name}.j2")
    if not res.is_file():
        raise ConfigError(f"no built-in template {name!r}; built in: {', '.join(builtin_names())}")
    return res.read_text(encoding="utf-8")


def user_names() -> list[str]:
    """Names of the user's templates."""
    d = user_dir()
    return sorted(p.stem for p in d.glob("*.j2")) if d.is_dir() else []


def find_template(name: str, kind: str | None = None) -> str:
    """The text of template ``name``: the user's first, then a built-in one."""
    for cand in (user_dir() / f"{name}.j2", user_dir() / name):
        if cand.is_file():
            return cand.read_text(encoding="utf-8")
    if name in builtin_names():
        return builtin_text(name)
    known = user_names() + builtin_names()
    raise ConfigError(
        f"no job-script template {name!r} (looked in {user_dir()} and the built-in ones); "
        f"known: {', '.join(known) or 'none'}"
    )


def install(name: str, *, source: str | None = None, force: bool = False) -> Path:
    """Copy a built-in template (``source``, default ``name``) into the user's folder."""
    text = builtin_text(source or name)
    d = user_dir()
    paths.private_dir(d)
    target = d / f"{name}.j2"
    if target.exists() and not force:
        raise ConfigError(f"{target} exists; pass --force to overwrite it")
    paths.write_private(target, text)
    return target
