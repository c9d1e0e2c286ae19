"""Files to and from an ssh host: rsync where both sides have it, else tar through ssh.

:class:`SSHCopies` is the file half of :class:`~elsewhere.hosts.ssh.SSHTransport` (``put``,
``get``, ``sync_up``, ``sync_down``); the transport brings the connection. Without rsync, the
tree code of :mod:`elsewhere.hosts.tree` runs on both sides: ``python -c TREE pack`` on one
streams a tar (zstd-compressed where the host has ``zstandard``) into ``python3 -c TREE
unpack`` on the other, through one ssh session.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from elsewhere.hosts.openssh import _NO_MASTER, build_rsync_rsh
from elsewhere.hosts.transport import CommandFailed, CompletedCommand, StreamSpec, close_quietly
from elsewhere.hosts.tree import TREE_SCRIPT, tree_functions
from elsewhere.util.errors import CommandNotFound, RemoteSetupError, TransportError

__all__ = ["SSHCopies"]

_KIND_SCRIPT = (
    'if [ -d "$1" ]; then echo d; elif [ -e "$1" ] || [ -L "$1" ]; then echo f; else echo m; fi'
)


class SSHCopies:
    """``put``, ``get``, ``sync_up`` and ``sync_down`` over an ssh connection (a mixin of
    :class:`~elsewhere.hosts.ssh.SSHTransport`, which provides what is declared below)."""

    if TYPE_CHECKING:
        destination: str
        python: str
        transfer: str
        compress: bool
        _caps: dict[str, Any]

        @property
        def host(self) -> str: ...
        @property
        def _where(self) -> str: ...
        def _ssh_argv(self, *, master: bool) -> list[str]: ...
        def _ensure_master(self) -> None: ...
        def _master_lost(self, attempt: int) -> None: ...
        def _run_ssh(self, argv: list[str], *, timeout: float | None, input: bytes | None = None,
                     command: Sequence[str] | None = None, program: str = "ssh") -> CompletedCommand: ...
        def run(self, argv: Sequence[str], *, input: bytes | None = None, timeout: float | None = None,
                check: bool = True, env: Any = None, cwd: str | None = None) -> CompletedCommand: ...
        def popen(self, argv: Sequence[str], *, stdin: StreamSpec = subprocess.DEVNULL,
                  stdout: StreamSpec = subprocess.PIPE, stderr: StreamSpec = subprocess.PIPE,
                  env: Any = None, cwd: str | None = None) -> subprocess.Popen[bytes]: ...
        def which(self, cmd: str) -> str | None: ...
        def connection_error(self, stderr: str, *, command: Sequence[str],
                             returncode: int | None) -> TransportError | None: ...


    def put(self, local_path: str | os.PathLike[str], remote_path: str) -> None:
        """Copy a local file or folder to ``remote_path`` (parents are created).

        A folder's contents go into ``remote_path``; a file becomes
        ``remote_path`` (or goes into it, if that is an existing folder).
        """
        local = os.path.abspath(os.fspath(local_path))
        is_dir = os.path.isdir(local)
        if not is_dir and not os.path.lexists(local):
            raise FileNotFoundError(2, "no such file or folder", local)
        if self._rsync_usable():
            if is_dir:
                self._rsync(
                    ["-W", "-I", local + "/", self._remote(remote_path) + "/"], mkdir=remote_path
                )
            else:
                parent = _remote_parent(remote_path)
                self._rsync(["-W", "-I", local, self._remote(remote_path)], mkdir=parent)
        else:
            self._tar_up(local, remote_path, {"codec": self._up_codec()})

    def get(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        """Copy a file or folder on the host to ``local_path`` (parents are created)."""
        local = os.path.abspath(os.fspath(local_path))
        if not self._rsync_usable():
            self._tar_down(remote_path, local, {})
            return
        kind = self.run(["sh", "-c", _KIND_SCRIPT, "sh", remote_path], timeout=60).text.strip()
        if kind == "m":
            raise FileNotFoundError(2, f"no such file or folder on {self.host}", remote_path)
        if kind == "d":
            os.makedirs(local, exist_ok=True)
            self._rsync(["-W", "-I", self._remote(remote_path) + "/", local + "/"])
        else:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            self._rsync(["-W", "-I", self._remote(remote_path), local])

    def sync_up(self, local_dir: str | os.PathLike[str], remote_dir: str) -> None:
        """Copy the files of ``local_dir`` whose size or mtime differ into ``remote_dir``.

        Nothing is deleted on the host.
        """
        local = os.path.abspath(os.fspath(local_dir))
        if not os.path.isdir(local):
            raise NotADirectoryError(20, "not a folder", local)
        if self._rsync_usable():
            self._rsync([local + "/", self._remote(remote_dir) + "/"], mkdir=remote_dir)
            return
        answer = self._tree_query("scan", remote_dir)
        self._tar_up(
            local, remote_dir, {"codec": self._up_codec(), "skip": answer.get("files") or {}}
        )

    def sync_down(
        self,
        remote_dir: str,
        local_dir: str | os.PathLike[str],
        *,
        include: Sequence[str] | None = None,
    ) -> None:
        """Copy the files of ``remote_dir`` that are new or changed into ``local_dir``.

        ``include``: rsync-style patterns (``"*.pkl"``, ``"results/**"``); when
        given, only matching files are copied. Nothing is deleted here.
        """
        local = os.path.abspath(os.fspath(local_dir))
        patterns = list(include or ())
        if self._rsync_usable():
            filters = []
            if patterns:
                filters = [
                    "-m",
                    "--include=*/",
                    *(f"--include={p}" for p in patterns),
                    "--exclude=*",
                ]
            os.makedirs(local, exist_ok=True)
            self._rsync([*filters, self._remote(remote_dir) + "/", local + "/"])
            return
        tree = tree_functions()
        skip = tree["scan"](local, tree["compile_patterns"](patterns))
        self._tar_down(remote_dir, local, {"include": patterns, "skip": skip, "dir_only": True})

    # --- rsync ---------------------------------------------------------------------------

    def note_remote_rsync(self, present: bool) -> None:
        """Record whether the host has rsync (learnt some other way), saving a ``which rsync``."""
        if self.transfer == "auto" and "rsync" not in self._caps:
            self._caps["rsync"] = bool(present and shutil.which("rsync"))

    def _rsync_usable(self) -> bool:
        if self.transfer == "tar":
            return False
        if "rsync" not in self._caps:
            here = shutil.which("rsync")
            there = self.which("rsync") if here else None
            if self.transfer == "rsync" and not (here and there):
                where = "here" if not here else f"on {self._where}"
                raise CommandNotFound(
                    f"rsync is not installed {where} (transfer='rsync'): install it "
                    "(Debian/Ubuntu: apt-get install rsync), or use transfer='auto'",
                    command=["rsync"],
                )
            self._caps["rsync"] = bool(here and there)
        return bool(self._caps["rsync"])

    def _remote(self, path: str) -> str:
        host = self.destination
        user, at, name = host.rpartition("@")
        if ":" in name:  # IPv6 address
            host = f"{user}{at}[{name}]"
        if path.startswith("-"):
            path = "./" + path
        return f"{host}:{path}"

    def _rsync(self, args: list[str], *, mkdir: str | None = None) -> None:
        argv = ["rsync", "-rlpt", "-s", "-e", build_rsync_rsh(self._ssh_argv(master=False))]
        if self.compress:
            argv.append("-z")
        if mkdir:
            argv += ["--rsync-path", f"mkdir -p {shlex.quote(mkdir)} && rsync"]
        argv += args
        for attempt in range(3):
            self._ensure_master()
            result = self._run_ssh(argv, timeout=None, program="rsync")
            if _NO_MASTER.encode() in result.stderr:
                self._master_lost(attempt)
                continue
            break
        if result.returncode == 0:
            return
        stderr = result.stderr.decode("utf-8", "replace")
        if result.returncode in (12, 255):
            error = self.connection_error(stderr, command=argv, returncode=result.returncode)
            if error is not None:
                raise error
        if result.returncode == 23 and "No such file or directory" in stderr:
            raise FileNotFoundError(2, f"rsync: no such file or folder ({self.host})", args[-2])
        raise CommandFailed(
            f"rsync to or from {self._where} failed",
            host=self.host,
            command=argv,
            returncode=result.returncode,
            stderr=stderr,
        )

    # --- the fallback: tar streams through ssh, packed and unpacked by TREE_SCRIPT ----------

    def _tree_query(self, mode: str, remote_dir: str) -> dict[str, Any]:
        words = [self.python, "-c", TREE_SCRIPT, mode, remote_dir]
        result = self.run(words, check=False, timeout=600)
        self._check_tree_result(result.returncode, result.stderr, f"{mode} {remote_dir}")
        marker = b"EWTREE1 "
        for line in reversed(result.stdout.splitlines()):
            if line.startswith(marker):
                answer: dict[str, Any] = json.loads(line[len(marker) :])
                self._caps["zstd"] = bool(answer.get("zstd"))
                return answer
        raise RemoteSetupError(
            f"{self.python} on {self._where} gave no answer to a folder scan",
            host=self.host,
            command=[self.python, "-c", "<elsewhere tree script>", mode, remote_dir],
            stderr=result.stderr.decode("utf-8", "replace"),
        )

    def _up_codec(self) -> str:
        if "zstd" not in self._caps:
            self._tree_query("caps", ".")
        return "zstd" if self._caps["zstd"] else "none"

    def _check_tree_result(self, returncode: int | None, stderr: bytes, what: str) -> None:
        if returncode == 0:
            return
        text = stderr.decode("utf-8", "replace")
        command = [self.python, "-c", "<elsewhere tree script>", *what.split(" ", 1)]
        if returncode == 255:
            error = self.connection_error(text, command=command, returncode=255)
            if error is not None:
                raise error
        if returncode in (126, 127):
            raise RemoteSetupError(
                f"no Python interpreter {self.python!r} on {self._where} (needed to copy files "
                "where rsync is missing): install Python 3 or rsync there, or pass python=",
                host=self.host,
                command=command,
                returncode=returncode,
                stderr=text,
            )
        if returncode == 3:
            raise FileNotFoundError(
                2, f"no such file or folder on {self.host}", what.split(" ", 1)[-1]
            )
        raise TransportError(
            f"copying files with {self.python} on {self._where} failed",
            host=self.host,
            command=command,
            returncode=returncode,
            stderr=text,
        )

    def _tar_up(self, local: str, remote: str, opts: dict[str, Any]) -> None:
        opts = {"level": 3 if self.compress else 1, **opts}
        with tempfile.TemporaryFile() as packer_err:
            packer = _local_tree_process("pack", local, stdout=subprocess.PIPE, stderr=packer_err)
            try:
                unpacker = self.popen(
                    [self.python, "-c", TREE_SCRIPT, "unpack", remote], stdin=packer.stdout
                )
            except BaseException:
                packer.kill()
                packer.wait()
                raise
            close_quietly(packer.stdout)
            _send_options(packer, opts)
            _, err = unpacker.communicate()
            packer.wait()
            packer_err.seek(0)
            if unpacker.returncode in (126, 127, 255):  # no Python there, or no connection
                self._check_tree_result(unpacker.returncode, err, f"unpack {remote}")
            if packer.returncode != 0:
                raise TransportError(
                    f"packing {local} for {self._where} failed",
                    host=self.host,
                    command=["pack", local],
                    returncode=packer.returncode,
                    stderr=packer_err.read().decode("utf-8", "replace"),
                )
            self._check_tree_result(unpacker.returncode, err, f"unpack {remote}")

    def _tar_down(self, remote: str, local: str, opts: dict[str, Any]) -> None:
        opts = {"codec": "auto", "level": 3 if self.compress else 1, **opts}
        with tempfile.TemporaryFile() as packer_err:
            packer = self.popen(
                [self.python, "-c", TREE_SCRIPT, "pack", remote],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=packer_err,
            )
            try:
                unpacker = _local_tree_process("unpack", local, stdin=packer.stdout)
            except BaseException:
                packer.kill()
                packer.wait()
                raise
            close_quietly(packer.stdout)
            _send_options(packer, opts)
            _, err = unpacker.communicate()
            packer.wait()
            packer_err.seek(0)
            self._check_tree_result(packer.returncode, packer_err.read(), f"pack {remote}")
            if unpacker.returncode == 3:
                raise FileNotFoundError(2, f"no such folder on {self.host}", remote)
            if unpacker.returncode != 0:
                raise TransportError(
                    f"unpacking files from {self._where} into {local} failed",
                    host=self.host,
                    command=["unpack", local],
                    returncode=unpacker.returncode,
                    stderr=err.decode("utf-8", "replace"),
                )


def _remote_parent(path: str) -> str | None:
    parent = os.path.dirname(path.rstrip("/"))
    return parent or None


def _local_tree_process(mode: str, root: str, **streams: Any) -> subprocess.Popen[bytes]:
    python = sys.executable or "python3"
    streams.setdefault("stdin", subprocess.PIPE)
    streams.setdefault("stdout", subprocess.PIPE)
    streams.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(
        [python, "-c", TREE_SCRIPT, mode, root], start_new_session=True, **streams
    )


def _send_options(packer: subprocess.Popen[bytes], opts: dict[str, Any]) -> None:
    assert packer.stdin is not None  # we asked for a pipe
    try:
        packer.stdin.write(json.dumps(opts).encode() + b"\n")
    except BrokenPipeError:
        pass  # the packer died; its exit code tells why
    close_quietly(packer.stdin)
