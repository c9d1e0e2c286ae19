"""The transport contract: run commands and move files, here or on another host.

Every layer above (clusters, the ssh backend, batch schedulers on a login node)
reaches other machines only through a :class:`Transport`. Two implementations
exist: :class:`~elsewhere.hosts.local.LocalTransport` (this machine, plain
subprocesses) and :class:`~elsewhere.hosts.ssh.SSHTransport` (the OpenSSH
client, one multiplexed connection per host). A test double is just another
transport.

The contract, for both::

    run(argv)            argv runs as given, never through a shell here; on an
                         ssh host every word is shlex-quoted for the remote shell
    run_shell(script)    a script for ``sh -c`` (or another shell), quoted by us
    popen(argv)          a started process whose pipes reach the command
    spawn(argv)          start detached (survives the connection), return its pid
    put / get            copy a file or a folder up / down, always
    sync_up / sync_down  copy only what is new or changed
    which(cmd)           the command's path there, or None

A command that cannot be found gives exit code 127 on both transports (as a
shell does); :meth:`CompletedCommand.check` turns that into
:class:`~elsewhere.util.errors.CommandNotFound` and any other non-zero exit into
:class:`CommandFailed`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol, runtime_checkable

from elsewhere.util import errors
from elsewhere.util.errors import CommandNotFound, ConfigError, TransportError
from elsewhere.util.signals import describe_returncode

__all__ = [
    "BaseTransport",
    "CommandFailed",
    "CommandTimeout",
    "CompletedCommand",
    "Transport",
]

#: ``popen`` arguments for a stream: ``subprocess.PIPE``, ``DEVNULL``, a file, a fd or None.
StreamSpec = Any


class CommandFailed(TransportError):
    """A command ran and exited with a non-zero code (``returncode``, ``stderr`` tail)."""


class CommandTimeout(TransportError, errors.TimeoutError):
    """A command ran past its timeout and was killed (locally; remotely where possible)."""


@dataclass(frozen=True)
class CompletedCommand:
    """The outcome of :meth:`Transport.run`.

    Attributes:
        argv: the command as the caller gave it (not the ssh wrapper around it).
        returncode: its exit code; negative for a signal (local only); 127 when
            the command was not found.
        stdout: everything it printed, as bytes.
        stderr: everything it printed on stderr, as bytes.
        seconds: wall time from start to exit, connection overhead included.
        host: where it ran (``"localhost"`` for a local transport).
    """

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes
    seconds: float
    host: str = "localhost"

    @property
    def ok(self) -> bool:
        """True when the command exited with code 0."""
        return self.returncode == 0

    @property
    def text(self) -> str:
        """``stdout`` decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    def check(self) -> CompletedCommand:
        """Return self if the command succeeded, else raise.

        Raises:
            CommandNotFound: exit code 127 (the shell's "command not found").
            CommandFailed: any other non-zero exit code; the message names the
                host, the command, the exit code and the tail of stderr.
        """
        if self.returncode == 0:
            return self
        stderr = self.stderr.decode("utf-8", "replace")
        command = list(self.argv)
        if self.returncode == 127:
            raise CommandNotFound(
                f"{self.argv[0]!r} was not found on {self.host}: install it there, "
                "or give its full path",
                command=command,
                returncode=127,
                stderr=stderr,
            )
        raise CommandFailed(
            f"command failed on {self.host}: {describe_returncode(self.returncode)}",
            host=self.host,
            command=command,
            returncode=self.returncode,
            stderr=stderr,
        )


@runtime_checkable
class Transport(Protocol):
    """Runs commands and moves files on one host. See the module docstring."""

    @property
    def host(self) -> str:
        """The host, as the user named it (``"localhost"`` for this machine)."""
        ...

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
        """Run ``argv`` to completion and return its outcome."""
        ...

    def run_shell(
        self,
        script: str,
        *,
        shell: Sequence[str] = ("sh",),
        input: bytes | None = None,
        timeout: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> CompletedCommand:
        """Run ``script`` with ``shell -c`` (e.g. ``("bash", "-l")`` for ``module load``)."""
        ...

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
        """Start ``argv`` and return the local process whose pipes reach it."""
        ...

    def spawn(
        self,
        argv: Sequence[str],
        *,
        log_path: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> int:
        """Start ``argv`` detached from this session; return its pid on the host."""
        ...

    def put(self, local_path: str | os.PathLike[str], remote_path: str) -> None:
        """Copy a local file or folder to ``remote_path``."""
        ...

    def get(self, remote_path: str, local_path: str | os.PathLike[str]) -> None:
        """Copy a file or folder on the host to ``local_path``."""
        ...

    def sync_up(self, local_dir: str | os.PathLike[str], remote_dir: str) -> None:
        """Copy the files of ``local_dir`` that are new or changed into ``remote_dir``."""
        ...

    def sync_down(
        self,
        remote_dir: str,
        local_dir: str | os.PathLike[str],
        *,
        include: Sequence[str] | None = None,
    ) -> None:
        """Copy the files of ``remote_dir`` that are new or changed into ``local_dir``."""
        ...

    def which(self, cmd: str) -> str | None:
        """The path of ``cmd`` on the host, or None when it is not on PATH."""
        ...

    def close(self) -> None:
        """Release connections; further use raises."""
        ...


# Runs in sh: start "$@" in a new session (setsid where it exists, else nohup),
# stdin from /dev/null, output to the log ($0), and print its pid.
_SPAWN_SCRIPT = (
    'log=$0; if command -v setsid >/dev/null 2>&1; then setsid "$@" </dev/null >"$log" 2>&1 & '
    'else nohup "$@" </dev/null >"$log" 2>&1 & fi; echo $!'
)


class BaseTransport:
    """What both transports share: shell scripts, detached starts, ``which``.

    Subclasses provide ``host``, ``run``, ``popen``, the file methods and ``close``.
    """

    @property
    def host(self) -> str:
        """The host, as the user named it."""
        raise NotImplementedError

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
        """Run ``argv`` to completion; see :class:`Transport`."""
        raise NotImplementedError

    def run_shell(
        self,
        script: str,
        *,
        shell: Sequence[str] = ("sh",),
        input: bytes | None = None,
        timeout: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> CompletedCommand:
        """Run ``script`` as ``shell -c script``.

        The script reaches the shell exactly as written: the transport quotes it
        for whatever lies between (the remote login shell), so ``$VAR``, ``;``
        and pipes in ``script`` mean what they mean in ``shell``. Pass
        ``shell=("bash", "-l")`` when the script needs login settings such as
        environment modules (``module load python; python3 ...``).
        """
        words = list(shell)
        if not words:
            raise ConfigError("run_shell: shell must name a program, e.g. ('sh',)")
        return self.run(
            [*words, "-c", script], input=input, timeout=timeout, check=check, env=env, cwd=cwd
        )

    def spawn(
        self,
        argv: Sequence[str],
        *,
        log_path: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> int:
        """Start ``argv`` detached: it outlives this call and the connection.

        stdin is ``/dev/null``; stdout and stderr go to ``log_path`` (on the host)
        or are dropped. Returns the pid on the host, to stop it later with
        ``run(["kill", str(pid)])``.
        """
        words = check_argv(argv)
        result = self.run(
            ["sh", "-c", _SPAWN_SCRIPT, log_path or "/dev/null", *words],
            env=env,
            cwd=cwd,
            timeout=60,
        )
        pid = result.text.strip().splitlines()[-1:] or [""]
        if not pid[0].isdigit():
            raise TransportError(
                f"starting a detached command on {self.host} printed no pid",
                host=self.host,
                command=words,
                stderr=result.stderr.decode("utf-8", "replace"),
            )
        return int(pid[0])

    def which(self, cmd: str) -> str | None:
        """The path of ``cmd`` on the host (``command -v``), or None."""
        result = self.run(["sh", "-c", 'command -v "$1"', "sh", cmd], check=False, timeout=60)
        path = result.text.strip()
        return path if result.returncode == 0 and path else None

    def close(self) -> None:
        """Release connections; further use raises."""

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` as a list of str, or ConfigError naming what is wrong with it."""
    if isinstance(argv, (str, bytes)):
        raise ConfigError(
            f"argv must be a list of words, not a single string: {argv!r} "
            "(use run_shell() for a shell command line)"
        )
    words = list(argv)
    if not words:
        raise ConfigError("argv is empty: name a command to run")
    for word in words:
        if not isinstance(word, str):
            raise ConfigError(f"argv words must be str, got {type(word).__name__}: {word!r}")
        if "\0" in word:
            raise ConfigError(f"argv word contains a NUL byte: {word!r}")
    return words


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """``env`` as a dict, or ConfigError for a name that is not a shell identifier."""
    if not env:
        return {}
    out: dict[str, str] = {}
    for name, value in env.items():
        if not (isinstance(name, str) and name.isidentifier() and name.isascii()):
            raise ConfigError(f"environment variable name {name!r} is not a valid identifier")
        if not isinstance(value, str) or "\0" in value:
            raise ConfigError(f"environment variable {name}: value must be a str without NUL")
        out[name] = value
    return out


def run_process(
    argv: Sequence[str],
    *,
    input: bytes | None,
    timeout: float | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    host: str,
    command: Sequence[str],
) -> CompletedCommand:
    """Run ``argv`` here, capture its output, kill its process group on timeout.

    ``command`` is what the caller asked for (shown in results and errors),
    which differs from ``argv`` when ``argv`` is an ssh wrapper.
    FileNotFoundError and PermissionError from starting the program propagate.

    Raises:
        CommandTimeout: the command ran past ``timeout`` seconds; it was killed.
    """
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        # its own process group: a timeout kills its children too, and a Ctrl-C
        # meant for Python does not reach it half-way through
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out, err = kill_process_group(proc)
        raise CommandTimeout(
            f"command ran past its timeout of {timeout:g} s on {host} and was killed",
            host=host,
            command=list(command),
            stderr=(err or b"").decode("utf-8", "replace"),
        ) from exc
    except BaseException:
        kill_process_group(proc)
        raise
    return CompletedCommand(
        argv=tuple(command),
        returncode=proc.returncode,
        stdout=out or b"",
        stderr=err or b"",
        seconds=time.monotonic() - start,
        host=host,
    )


def kill_process_group(proc: subprocess.Popen[bytes], grace_s: float = 1.0) -> tuple[bytes, bytes]:
    """SIGTERM the group led by ``proc``, SIGKILL after ``grace_s``; return leftover output."""
    out: bytes = b""
    err: bytes = b""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            o, e = proc.communicate(timeout=grace_s)
            return out + (o or b""), err + (e or b"")
        except subprocess.TimeoutExpired:
            continue
        except ValueError:  # pipes already closed by an earlier communicate
            break
    # a grandchild in another session may still hold the pipes: stop reading
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    proc.wait()
    return out, err


def close_quietly(stream: IO[bytes] | None) -> None:
    """Close a pipe, ignoring a reader that already went away."""
    if stream is not None:
        try:
            stream.close()
        except OSError:
            pass
