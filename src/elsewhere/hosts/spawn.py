"""Starting a detached Python on this machine: a worker, an agent's worker, a background peer.

Every such start is the same few decisions, made here once:

- its own session (``setsid``): a Ctrl-C or a closed terminal of the starter does not reach
  it, and it outlives the starter;
- stdin from ``/dev/null``, stdout and stderr appended to a log (or dropped);
- the interpreter by its absolute path (a ``python3`` shim on PATH can cost 120 ms a start),
  or a :class:`~elsewhere.util.command.PythonCommand` (``python=`` of a cluster: a container
  runtime, ``module load``...) whose first word is made absolute the same way;
- ``PYTHONPATH`` led by the folder that holds this elsewhere, so that the new process imports
  the same elsewhere when it is not installed for that interpreter (a source checkout);
- no file descriptors of the starter but the ones asked for.

:func:`spawn_python` returns the :class:`subprocess.Popen`; :func:`spawn_python_pid` starts
with ``posix_spawn`` where it can (no copy of a large starter's page tables: milliseconds
less for a client holding big arrays) and returns the pid, which its caller reaps.

A detached command on another host is :meth:`~elsewhere.hosts.transport.Transport.spawn`.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

from elsewhere.util.command import PythonCommand

__all__ = ["package_root", "python_env", "python_path", "spawn_python", "spawn_python_pid"]

@functools.cache
def package_root() -> str:
    """The folder that holds the ``elsewhere`` package (``src`` in a source checkout)."""
    here = os.path.realpath(__file__)  # .../elsewhere/hosts/spawn.py
    return os.path.dirname(os.path.dirname(os.path.dirname(here)))


def python_env(env: Mapping[str, str] | None = None, *, importable: bool = True) -> dict[str, str]:
    """``env`` (default: this process's environment) as a new dict, with ``PYTHONPATH`` led by
    :func:`package_root` when ``importable`` (left as it is when it already leads)."""
    out = dict(os.environ if env is None else env)
    if importable:
        root = package_root()
        old = out.get("PYTHONPATH")
        if not old:
            out["PYTHONPATH"] = root
        elif old.split(os.pathsep)[0] != root:
            out["PYTHONPATH"] = root + os.pathsep + old
    return out


def python_path(python: str | os.PathLike[str] | None = None) -> str:
    """The interpreter's absolute path: ``python`` (a path, or a name looked up on PATH), or
    this interpreter. Symlinks are kept (a venv's interpreter is one)."""
    if python is None:
        return sys.executable or shutil.which("python3") or "python3"
    name = os.fspath(python)
    if os.sep not in name:
        return shutil.which(name) or name
    return os.path.abspath(name)


def spawn_python(
    args: Sequence[str],
    *,
    log: str | os.PathLike[str] | int | None = None,
    python: str | os.PathLike[str] | PythonCommand | None = None,
    env: Mapping[str, str] | None = None,
    importable: bool = True,
    cwd: str | os.PathLike[str] | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start ``python args...`` detached (see the module docstring) and return it.

    Args:
        args: what follows the interpreter: ``["-m", "elsewhere.worker", "--job", path]``.
        log: where stdout and stderr go: a path (appended to; created with mode 0600), an
            open file descriptor (left open), or None (``/dev/null``).
        python: the interpreter (default this one), a path or a name on PATH; or a
            :class:`~elsewhere.util.command.PythonCommand`, whose words come first. Made
            absolute.
        env: the whole environment of the new process (default this one's).
        importable: lead ``PYTHONPATH`` with the folder holding this elsewhere.
        cwd: its working folder (default this process's).
        pass_fds: descriptors it inherits (all others are closed).

    Raises:
        FileNotFoundError: no such interpreter (or ``cwd``).
    """
    argv = _argv(python, args)
    fd, owned = _open_log(log)
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            env=python_env(env, importable=importable),
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )
    finally:
        if owned:
            os.close(fd)


def spawn_python_pid(
    args: Sequence[str],
    *,
    log: str | os.PathLike[str] | int | None = None,
    python: str | os.PathLike[str] | PythonCommand | None = None,
    env: Mapping[str, str] | None = None,
    importable: bool = True,
) -> int:
    """Start ``python args...`` detached, by ``posix_spawn`` where the system can make a
    session with it (else as :func:`spawn_python`); return its pid.

    The caller reaps it (``os.waitpid(pid, os.WNOHANG)`` now and then), or it stays a zombie
    while the caller lives. It starts in the caller's working folder: a process that outlives
    the caller leaves it itself (a pool worker does). posix_spawn closes no descriptors: those
    the caller made inheritable reach it (Python makes none so by itself). Arguments as for
    :func:`spawn_python`.
    """
    argv = _argv(python, args)
    exe = argv[0]
    full_env = python_env(env, importable=importable)
    fd, owned = _open_log(log)
    try:
        try:
            # vfork and exec in a session of its own: a fork of a big starter costs milliseconds
            return os.posix_spawn(
                exe,
                argv,
                full_env,
                setsid=True,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, fd, 1),
                    (os.POSIX_SPAWN_DUP2, fd, 2),
                ],
            )
        except (AttributeError, NotImplementedError):  # no posix_spawn, or no setsid for it
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                env=full_env,
                start_new_session=True,
                close_fds=True,
            ).pid
    finally:
        if owned:
            os.close(fd)


def _argv(python: str | os.PathLike[str] | PythonCommand | None, args: Sequence[str]) -> list[str]:
    """The argv that starts ``python`` with ``args``, its program by an absolute path."""
    if isinstance(python, PythonCommand):
        words = python.argv(*args)
        return [python_path(words[0]), *words[1:]]
    return [python_path(python), *args]


def _open_log(log: str | os.PathLike[str] | int | None) -> tuple[int, bool]:
    """(a descriptor for the log, whether it is ours to close)."""
    if isinstance(log, int):
        return log, False
    path = os.devnull if log is None else os.fspath(log)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), True
