"""Where elsewhere keeps things on this machine.

Everything lives under one *home* folder: ``$ELSEWHERE_HOME`` when set, else
the user data directory (``platformdirs.user_data_dir("elsewhere")``)::

    <home>/jobs/<job id>/     job folders (the default storage location)
    <home>/registry.sqlite    the registry of jobs (name -> folder, state); registry.lock
    <home>/local/<pool>/      warm local worker processes (see clusters/local.py)

Configuration (profiles, job-script templates, peer keys) lives in the user
config directory, or ``$ELSEWHERE_CONFIG`` when set.

Privacy: what elsewhere makes under these folders is its user's alone, whatever the
process umask: folders mode 0700 (:func:`private_dir`), files 0600 (:func:`private_file`,
:func:`write_private`). Open modes given to ``mkdir``/``open`` are masked by the umask (so
they can only lose bits) and ``mkdir -p`` makes the parents with the default 0777 & ~umask:
hence these helpers, which create every missing level themselves and set the mode after.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_PRIVATE_FILE = 0o600
_PRIVATE_DIR = 0o700


_homes: dict[tuple[str | None, str | None, str | None], Path] = {}
"""The home found for the environment variables it depends on (platformdirs takes tens of
microseconds to find it, and a submission asks several times)."""


def home() -> Path:
    """The folder that holds job storage, the registry and the local pool."""
    env = os.environ.get("ELSEWHERE_HOME")
    key = (env, os.environ.get("XDG_DATA_HOME"), os.environ.get("HOME"))
    found = _homes.get(key)
    if found is not None:
        return found
    if env:
        given = Path(env).expanduser()
        found = given.absolute()
        if not given.is_absolute():
            return found  # (relative to the working directory, which may change: not kept)
    else:
        import platformdirs

        found = Path(platformdirs.user_data_dir("elsewhere", appauthor=False))
    _homes[key] = found
    return found


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


def private_dir(path: str | os.PathLike[str], *, fix: bool = False) -> None:
    """Make the folder ``path`` and its missing parents, each with mode 0700 whatever the
    umask. A folder that exists is left as it is, unless ``fix``: then, if it is the user's
    and open to group or others (made by an older version, or under umask 0), it is closed
    to 0700. Use ``fix`` only for folders that are elsewhere's own (the home, its pools)."""
    path = os.fspath(path)
    try:
        os.mkdir(path, _PRIVATE_DIR)
    except FileExistsError:
        if fix:
            _close_dir(path)
        elif not os.path.isdir(path):
            raise
        return
    except FileNotFoundError:
        parent = os.path.dirname(path.rstrip(os.sep))
        if not parent or parent == path:
            raise
        private_dir(parent)
        try:
            os.mkdir(path, _PRIVATE_DIR)
        except FileExistsError:  # another process made it meanwhile
            return
    os.chmod(path, _PRIVATE_DIR)  # a umask such as 0277 would have taken bits off


def _close_dir(path: str) -> None:
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} is not a folder")
    if st.st_mode & 0o077 and st.st_uid == os.getuid():
        os.chmod(path, _PRIVATE_DIR)


def private_file(path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_TRUNC) -> int:
    """Open ``path`` (``flags``, plus ``O_CREAT``) as a file of mode 0600 whatever the umask,
    and return the descriptor. An existing file of the user's that others may read is
    closed to 0600 too."""
    fd = os.open(path, flags | os.O_CREAT, _PRIVATE_FILE)
    try:
        st = os.fstat(fd)
        if stat.S_IMODE(st.st_mode) != _PRIVATE_FILE and st.st_uid == os.getuid():
            os.fchmod(fd, _PRIVATE_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to the file ``path``, mode 0600 (see :func:`private_file`)."""
    view = memoryview(data.encode() if isinstance(data, str) else data)
    fd = private_file(path)
    try:
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
