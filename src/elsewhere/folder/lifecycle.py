"""A job folder as the client makes and removes it.

:func:`new_job_meta` is a new job's metadata (``job.json``), :func:`create_store`
makes its folder with a first queue, and :func:`remove_folder` removes it for
good. ``with busy():`` keeps the garbage collector and the background
housekeeping off while the client submits or reads results.
"""

from __future__ import annotations

import getpass
import os
import shutil
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..util.errors import ConfigError
from .queue import new_queue
from .store import JobStore

if TYPE_CHECKING:
    from pathlib import Path


def remove_folder(path: Path) -> bool:
    """Remove a job folder for good, even while a worker is still leaving it; True if this
    call removed it, False if it was gone already.

    The folder is first renamed away, atomically: a worker that opens a file
    by the job's path from then on gets FileNotFoundError (and returns to its
    pool) instead of recreating files that would keep the folder alive. Of
    several processes that remove one folder at once, exactly one renames it
    (and gets True).
    """
    from . import housekeeping

    grave = path.with_name(housekeeping.grave_name(path.name))
    try:
        os.rename(path, grave)
    except FileNotFoundError:
        return False
    except OSError:
        # another file system's rules: remove in place, now
        if not path.exists():
            return False
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        return True
    housekeeping.remove_later(grave, path)  # gone for everyone already; the bytes go in the background
    return True


def new_job_meta(
    *,
    name: str,
    job_id: str,
    cluster: dict[str, Any],
    cores_per_task: int,
    seed: int | None,
    tag: str,
    retries: int,
    env: dict[str, str] | None,
    stream: bool = False,
    communicating: bool = False,
    retry: dict[str, Any] | None = None,
    after: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The metadata of a new job, as written to job.json (``cluster``: the cluster's description;
    ``retries``: reruns of lost tasks; ``retry``: the policy for errors run again,
    ``Retry.spec()``; ``after``: the jobs it waits for, ``{"id", "name", "path"}`` each).
    Raises ConfigError for a ``tag`` that is not text or an ``env`` that is not a mapping of
    variable names to text (a number is written as its text)."""
    tag = "" if tag is None else tag
    if not isinstance(tag, str):
        raise ConfigError(f"tag must be text, not {tag!r}")
    env = _environment(env)
    cwd = os.getcwd()
    meta = {
        "format": 2,
        "id": job_id,
        "name": name,
        "user": _user(),
        "tag": tag,
        "created": time.time(),
        "submitted": None,
        "cluster": cluster,
        "seed": seed,
        "retries": retries,
        "cores_per_task": cores_per_task,
        "n_tasks": 0,
        "stream": stream,
        "communicating": communicating,
        "cwd": cwd,
        "sys_path": [os.path.abspath(p) if p else cwd for p in sys.path],
        "env": env,
        "client": {"host": os.uname().nodename, "pid": os.getpid(), "python": sys.executable},
    }
    if retry:
        meta["retry"] = retry
    if after:
        meta["after"] = after
    return meta


def _environment(env: Any) -> dict[str, str]:
    """``env=`` checked: variable names (text, without ``=``) to values, text or numbers (a
    number is written as its text, as a shell would)."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ConfigError(f"env must be a dict of environment variables to values, such as "
                          f"{{'OMP_NUM_THREADS': '1'}}, not {env!r}")  # fmt: skip
    out = {}
    for k, v in env.items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k:
            raise ConfigError(f"env: {k!r} is not the name of an environment variable (text, without '=')")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = str(v)
        if not isinstance(v, str) or "\0" in v:
            raise ConfigError(f"env: the value of {k} must be text (or a number), not {v!r}")
        out[k] = v
    return out


def job_folders(meta: Mapping[str, Any]) -> list[str]:
    """The folders of a job's recorded ``sys.path`` that exist on this machine, in order."""
    return [p for p in meta.get("sys_path") or [] if isinstance(p, str) and p and os.path.isdir(p)]


def import_from_job(meta: Mapping[str, Any]) -> bool:
    """Make the modules a job's pickles name importable in this process: append to
    ``sys.path`` the folders of the job's ``sys.path`` and working directory (as recorded
    in ``meta``) that exist here and are not on it yet. Appended, they shadow nothing this
    process imports already. For a process other than the job's (``elsewhere results`` or
    ``ew.recover(NAME)`` from another folder) that meets a module of the user's it cannot
    import. True if any folder was added."""
    import importlib
    import logging

    cwd = meta.get("cwd")
    found = job_folders(meta) + ([cwd] if isinstance(cwd, str) and os.path.isdir(cwd) else [])
    added = [p for p in dict.fromkeys(found) if p not in sys.path]
    if not added:
        return False
    logging.getLogger(__name__).info("importing job %r's modules from its folders: %s", meta.get("name"),
                                     ", ".join(added))  # fmt: skip
    sys.path.extend(added)
    importlib.invalidate_caches()
    return True


def _user() -> str:
    """The user's login name (looked up once: without $USER it reads the password file)."""
    global _user_name
    if _user_name is None:
        try:
            _user_name = getpass.getuser()
        except (KeyError, OSError):  # a uid with no entry (containers)
            _user_name = str(os.getuid())
    return _user_name


_user_name: str | None = None


def create_store(root: Path, meta: dict[str, Any], *, retries: int, stream: bool, n_tasks: int = 0) -> JobStore:
    """Make the job folder with metadata and a queue of ``n_tasks`` (known up front, or 0).

    Nothing is claimed before the queue says "submitted", so the count may be
    written before the inputs are.
    """
    from .queue import write_queue

    store = JobStore.create(root / meta["id"], meta)
    write_queue(store, new_queue(n_tasks, closed=not stream, retries=retries), 1, 0)
    return store


class busy:
    """``with busy():`` submitting or reading results: the cyclic garbage collector
    is off (many small objects without cycles, which it would only rescan) and the
    background housekeeping waits (``housekeeping.hot``)."""

    def __enter__(self) -> None:
        import gc

        from . import housekeeping

        self.was = gc.isenabled()
        gc.disable()
        self.hot = housekeeping.hot()
        self.hot.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.hot.__exit__()
        if self.was:
            import gc

            gc.enable()
