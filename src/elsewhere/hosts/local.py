"""This machine as a transport: subprocesses without a shell, file copies.

Files are copied by the tree code of :mod:`elsewhere.hosts.tree` (the same code that copies
to an ssh host without rsync), each file atomically.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from elsewhere.hosts.transport import (
    BaseTransport,
    CompletedCommand,
    StreamSpec,
    check_argv,
    check_env,
    run_process,
)
from elsewhere.hosts.tree import TREE_SCRIPT, copy_path, tree_functions
from elsewhere.util.errors import CommandNotFound

# TREE_SCRIPT and tree_functions live in elsewhere.hosts.tree; their names here still work
__all__ = ["TREE_SCRIPT", "LocalTransport", "tree_functions"]


class LocalTransport(BaseTransport):
    """The :class:`~elsewhere.hosts.transport.Transport` contract on this machine.

    Commands run as subprocesses without a shell, in their own process group
    (a timeout kills the whole group). ``env`` adds to (and overrides) this
    process's environment. A missing program gives exit code 127, as on an
    ssh host, so ``check()`` raises CommandNotFound on both.
    """

    def __init__(self) -> None:
        self._closed = False

    def __repr__(self) -> str:
        return "LocalTransport()"

    @property
    def host(self) -> str:
        """Always ``"localhost"``."""
        return "localhost"

    def run(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        timeout: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> CompletedCommand:
        """Run ``argv`` here to completion; see :class:`~elsewhere.hosts.transport.Transport`.

        Raises:
            CommandTimeout: past ``timeout`` seconds (the process group is killed).
            CommandNotFound, CommandFailed: from ``check()`` when ``check`` is true.
        """
        words = check_argv(argv)
        extra = check_env(env)
        try:
            result = run_process(
                words,
                input=input,
                timeout=timeout,
                env={**os.environ, **extra} if extra else None,
                cwd=cwd,
                host=self.host,
                command=words,
            )
        except OSError as exc:
            result = self._start_failure(words, cwd, exc)
        return result.check() if check else result

    def _start_failure(self, words: list[str], cwd: str | None, exc: OSError) -> CompletedCommand:
        # mirror what a shell reports, so both transports give the same codes
        if cwd is not None and not os.path.isdir(cwd):
            code, message = 1, f"cd: {cwd}: No such file or directory"
        elif isinstance(exc, FileNotFoundError):
            code, message = 127, f"{words[0]}: command not found"
        elif isinstance(exc, PermissionError):
            code, message = 126, f"{words[0]}: Permission denied"
        else:
            raise exc
        return CompletedCommand(tuple(words), code, b"", message.encode() + b"\n", 0.0, self.host)

    def popen(
        self,
        argv: Sequence[str],
        *,
        stdin: StreamSpec = subprocess.DEVNULL,
        stdout: StreamSpec = subprocess.PIPE,
        stderr: StreamSpec = subprocess.PIPE,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` here (own process group) and return it.

        Raises:
            CommandNotFound: the program does not exist.
        """
        words = check_argv(argv)
        extra = check_env(env)
        try:
            return subprocess.Popen(
                words,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                env={**os.environ, **extra} if extra else None,
                cwd=cwd,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise CommandNotFound(
                f"{words[0]!r} was not found on localhost", command=words
            ) from exc

    def put(self, local_path: str | os.PathLike[str], remote_path: str) -> None:
        """Copy a file or folder to ``remote_path`` (here: another path)."""
        copy_path(os.fspath(local_path), remote_path, only_changed=False)

    def get(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        """Copy a file or folder from ``remote_path`` (here: another path)."""
        copy_path(remote_path, os.fspath(local_path), only_changed=False)

    def sync_up(self, local_dir: str | os.PathLike[str], remote_dir: str) -> None:
        """Copy new or changed files (size or mtime differ) of ``local_dir`` into ``remote_dir``."""
        _require_dir(os.fspath(local_dir))
        copy_path(os.fspath(local_dir), remote_dir, only_changed=True)

    def sync_down(
        self,
        remote_dir: str,
        local_dir: str | os.PathLike[str],
        *,
        include: Sequence[str] | None = None,
    ) -> None:
        """Copy new or changed files of ``remote_dir`` into ``local_dir``.

        ``include``: rsync-style patterns; only matching files are copied.
        """
        _require_dir(remote_dir)
        copy_path(remote_dir, os.fspath(local_dir), only_changed=True, include=include)

    def which(self, cmd: str) -> str | None:
        """``shutil.which(cmd)``."""
        return shutil.which(cmd)

    def close(self) -> None:
        """Nothing to release."""
        self._closed = True


def _require_dir(path: str) -> None:
    if not os.path.isdir(path):
        if not os.path.lexists(path):
            raise FileNotFoundError(2, "no such folder", path)
        raise NotADirectoryError(20, "not a folder", path)
