"""A host reached through the system's OpenSSH client.

Who talks to whom::

    SSHTransport.run(argv) ── ssh -o ControlMaster=no ... dest 'quoted words' ─┐
    SSHTransport.put/get ──── rsync -e 'ssh -o ControlMaster=no ...' ──────────┤  unix socket
                         └─── python -c TREE pack | ssh ... python3 -c TREE ───┤  (ControlPath)
                                                                               v
                          master: ssh -M -N -f -o ControlPersist=600 dest ── one TCP connection
                                                                               v
                                               sshd ── the user's login shell ── the command

Using the ``ssh`` binary means ``~/.ssh/config``, the agent, ProxyJump and
site rules work as they do in a shell. The first use opens one *master*
connection (counted in :attr:`SSHTransport.connections_opened`); every later
command, rsync included, is a session multiplexed over it. Clients are run
with a ``ProxyCommand`` that only fails, so a client can never quietly open a
second connection when the master has gone: it fails with a marker, and the
transport opens a new master (counted) and retries.

The remote side runs the command line through the user's login shell, so each
word is quoted with :func:`shlex.quote`; nothing in an argument is ever
interpreted there. Remote paths are absolute or relative to the remote home;
``~`` is not expanded.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from elsewhere.hosts.local import TREE_SCRIPT
from elsewhere.hosts.transport import (
    BaseTransport,
    CommandFailed,
    CommandTimeout,
    CompletedCommand,
    StreamSpec,
    check_argv,
    check_env,
    close_quietly,
    run_process,
)
from elsewhere.util.errors import (
    AuthenticationError,
    CommandNotFound,
    ConfigError,
    HostKeyError,
    HostUnreachable,
    RemoteSetupError,
    TransportError,
)

__all__ = [
    "SSHTransport",
    "build_remote_command",
    "build_rsync_rsh",
    "parse_ssh_failure",
]

logger = logging.getLogger(__name__)

_NO_MASTER = "elsewhere-no-master-connection"
# For clients only: reached only when the master is gone, and then it fails loudly.
_MUX_ONLY_PROXY = f'sh -c "echo {_NO_MASTER} >&2; exit 255"'
# ssh binds "<ControlPath>.<16 random chars>" first; sun_path is 104 bytes on
# macOS and the BSDs (108 on Linux), the final NUL included.
_SOCKET_PATH_MAX = 104 - 1 - 17
_SAFE_DIR = re.compile(r"[A-Za-z0-9_./+-]+\Z")
# Kills the remote command on timeout where coreutils' timeout exists ($1 = seconds).
_TIMEOUT_WRAPPER = (
    'if command -v timeout >/dev/null 2>&1; then exec timeout -k 5 "$@"; fi; shift; exec "$@"'
)
_KIND_SCRIPT = (
    'if [ -d "$1" ]; then echo d; elif [ -e "$1" ] || [ -L "$1" ]; then echo f; else echo m; fi'
)

# (pattern in ssh's stderr, kind); the first match wins, so order matters.
_FAILURES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|host key for .* has changed", re.I), "hostkey-changed"),
    (re.compile(r"Host key verification failed|No \S+ host key is known", re.I), "hostkey-unknown"),
    (re.compile(r"Permission denied|Too many authentication failures|no more authentication methods", re.I), "auth"),
    (re.compile(r"Could not resolve hostname|Name or service not known|nodename nor servname|name resolution", re.I), "resolve"),
    (re.compile(r"Connection refused", re.I), "refused"),
    (re.compile(r"timed out|Connection timeout", re.I), "timeout"),
    (re.compile(r"No route to host|Network is unreachable|Host is down", re.I), "route"),
    (re.compile(r"Connection closed by|Connection reset|kex_exchange_identification|Broken pipe|Timeout, server", re.I), "closed"),
]  # fmt: skip


def parse_ssh_failure(stderr: str) -> str | None:
    """Classify ssh's own error text: ``"hostkey-changed"``, ``"hostkey-unknown"``,
    ``"auth"``, ``"resolve"``, ``"refused"``, ``"timeout"``, ``"route"``,
    ``"closed"``, or None when it is not a connection failure."""
    for pattern, kind in _FAILURES:
        if pattern.search(stderr):
            return kind
    return None


def build_remote_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
) -> str:
    """The command line for the remote login shell: every word ``shlex.quote``-d.

    ``env`` becomes ``env NAME=value ...`` (works in sh, bash, zsh, csh and fish),
    ``cwd`` a leading ``cd dir &&``, ``timeout`` a ``sh -c`` wrapper that runs the
    command under coreutils ``timeout`` where the host has it, so the remote
    process dies too when the local side gives up.
    """
    words = check_argv(argv)
    extra = check_env(env)
    if extra:
        words = ["env", *(f"{name}={value}" for name, value in extra.items()), *words]
    if timeout is not None:
        seconds = str(max(1, math.ceil(timeout)))
        words = ["sh", "-c", _TIMEOUT_WRAPPER, "sh", seconds, *words]
    line = " ".join(shlex.quote(word) for word in words)
    if cwd is not None:
        line = f"cd {shlex.quote(cwd)} && {line}"
    return line


def build_rsync_rsh(ssh_argv: Sequence[str]) -> str:
    """``ssh_argv`` as one string for ``rsync -e``, quoted the way rsync splits it.

    rsync splits on spaces, honours single and double quotes, and reads a
    doubled quote inside quotes as one literal quote; backslashes mean nothing.
    """
    out = []
    for word in ssh_argv:
        if word and not re.search(r"[\s'\"]", word):
            out.append(word)
        else:
            out.append("'" + word.replace("'", "''") + "'")
    return " ".join(out)


def check_destination(destination: str) -> str:
    """``destination`` if ssh would read it as a host, else ConfigError saying why."""
    if not isinstance(destination, str) or not destination:
        raise ConfigError("destination must be a host name, 'user@host' or a ~/.ssh/config alias")
    if destination.startswith("-"):
        raise ConfigError(f"destination {destination!r} must not start with '-'")
    if any(c.isspace() or ord(c) < 32 for c in destination):
        raise ConfigError(f"destination {destination!r} contains whitespace or control characters")
    if destination.startswith("ssh://"):
        raise ConfigError(f"destination {destination!r}: give 'user@host' and the port as port=")
    host = destination.rsplit("@", 1)[-1]
    if host.count(":") == 1:
        port = host.partition(":")[2]
        raise ConfigError(
            f"destination {destination!r}: 'host:port' is not ssh syntax; "
            f"write SSHTransport({destination.rsplit(':', 1)[0]!r}, port={port or 'N'})"
        )
    return destination


def default_control_dir() -> str:
    """A private folder for master sockets with a short path (sockets need one)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        candidate = os.path.join(runtime, "elsewhere-ssh")
        if len(candidate) <= _SOCKET_PATH_MAX - 24 and _SAFE_DIR.match(candidate):
            return candidate
    return f"/tmp/elsewhere-ssh-{os.getuid()}"


def ensure_private_dir(path: str) -> None:
    """Create ``path`` with mode 0700, or check that it is ours and private."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"ssh control folder {path} is not a folder (a symlink?); remove it")
    if st.st_uid != os.getuid():
        raise ConfigError(
            f"ssh control folder {path} belongs to another user; remove it or pass control_dir="
        )
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


class SSHTransport(BaseTransport):
    """Commands and files on a host reached with the OpenSSH client.

    Args:
        destination: the host as you would type it after ``ssh``: ``"host"``,
            ``"user@host"`` or an alias from ``~/.ssh/config``.
        port: the port, when it is not 22 and not set in the ssh config.
        ssh_options: extra ``-o`` options, ``"Key=value"`` each (they win over
            ``ssh_config``, not over the multiplexing and BatchMode settings).
        ssh_config: an ssh config file to use instead of ``~/.ssh/config``.
        control_dir: a private folder for the master's socket (made 0700);
            default ``$XDG_RUNTIME_DIR/elsewhere-ssh`` or ``/tmp/elsewhere-ssh-UID``.
            Too long a path for a unix socket falls back to the default.
        connect_timeout_s: how long to wait for the host to answer.
        control_persist_s: how long an idle master stays after its last session;
            the next use (another transport, a later process) reuses it.
        python: the interpreter on the host that the tar fallback runs.
        transfer: ``"auto"`` (rsync where both sides have it, else tar through
            ssh), ``"rsync"`` (required) or ``"tar"``.
        compress: compress transfers (rsync ``-z``; zstd level 3 in the tar
            fallback, which compresses whenever the host has ``zstandard``).
        max_sessions: commands in flight at once over the master (sshd's
            MaxSessions is 10 by default).

    Attributes:
        connections_opened: master connections this object opened (one TCP
            connection and one login each).
        control_path: the master's socket.
    """

    def __init__(
        self,
        destination: str,
        *,
        port: int | None = None,
        ssh_options: Sequence[str] = (),
        ssh_config: str | os.PathLike[str] | None = None,
        control_dir: str | os.PathLike[str] | None = None,
        connect_timeout_s: float = 10,
        control_persist_s: int = 600,
        python: str | None = None,
        transfer: str = "auto",
        compress: bool = False,
        max_sessions: int = 8,
    ) -> None:
        self.destination = check_destination(destination)
        if port is not None and not (isinstance(port, int) and 0 < port < 65536):
            raise ConfigError(f"port must be an int from 1 to 65535, got {port!r}")
        self.port = port
        self.ssh_options = tuple(_check_option(o) for o in ssh_options)
        self.ssh_config = os.path.abspath(os.fspath(ssh_config)) if ssh_config else None
        if self.ssh_config and not os.path.isfile(self.ssh_config):
            raise ConfigError(f"ssh_config {self.ssh_config} does not exist")
        if transfer not in ("auto", "rsync", "tar"):
            raise ConfigError(f"transfer must be 'auto', 'rsync' or 'tar', got {transfer!r}")
        if connect_timeout_s <= 0 or control_persist_s <= 0 or max_sessions < 1:
            raise ConfigError("connect_timeout_s, control_persist_s and max_sessions must be > 0")
        self.connect_timeout_s = connect_timeout_s
        self.control_persist_s = int(control_persist_s)
        self.python = python or "python3"
        self.transfer = transfer
        self.compress = compress
        self.connections_opened = 0
        key = json.dumps(
            [os.getuid(), self.destination, port, self.ssh_config, list(self.ssh_options)]
        )
        name = "cm-" + hashlib.sha256(key.encode()).hexdigest()[:20]
        folder = os.path.abspath(os.fspath(control_dir)) if control_dir else default_control_dir()
        if len(os.path.join(folder, name).encode()) > _SOCKET_PATH_MAX or not _SAFE_DIR.match(
            folder
        ):
            logger.warning(
                "ssh control folder %s is too long (or has unusual characters) for a socket "
                "path; using %s",
                folder,
                default_control_dir(),
            )
            folder = default_control_dir()
        self.control_dir = folder
        self.control_path = os.path.join(folder, name)
        self._lock = threading.Lock()
        self._sessions = threading.BoundedSemaphore(max_sessions)
        self._master_ready = False
        self._opened_master = False
        self._closed = False
        self._caps: dict[str, Any] = {}

    def __repr__(self) -> str:
        port = f", port={self.port}" if self.port else ""
        return f"SSHTransport({self.destination!r}{port})"

    @property
    def host(self) -> str:
        """The destination as given (``"user@host"``, an alias...)."""
        return self.destination

    @property
    def _where(self) -> str:
        return f"{self.destination} (port {self.port})" if self.port else self.destination

    # --- the master connection ---------------------------------------------------------

    def _ssh_argv(self, *, master: bool) -> list[str]:
        argv = ["ssh"]
        if self.ssh_config:
            argv += ["-F", self.ssh_config]
        # ssh keeps the first value it sees for an option: ours first where they
        # must hold, then the user's, then defaults the user may override
        opts = ["BatchMode=yes", f"ControlPath={self.control_path}"]
        if master:
            opts += ["ControlMaster=yes", f"ControlPersist={self.control_persist_s}"]
        else:
            opts += ["ControlMaster=no", f"ProxyCommand={_MUX_ONLY_PROXY}"]
        opts += self.ssh_options
        opts += [
            f"ConnectTimeout={max(1, math.ceil(self.connect_timeout_s))}",
            "ServerAliveInterval=15",
            "ServerAliveCountMax=4",
            "LogLevel=ERROR",
        ]
        for opt in opts:
            argv += ["-o", opt]
        if self.port:
            argv += ["-p", str(self.port)]
        return argv

    def _run_ssh(
        self,
        argv: list[str],
        *,
        timeout: float | None,
        input: bytes | None = None,
        command: Sequence[str] | None = None,
    ) -> CompletedCommand:
        try:
            return run_process(
                argv,
                input=input,
                timeout=timeout,
                env=None,
                cwd=None,
                host=self.host,
                command=argv if command is None else command,
            )
        except FileNotFoundError as exc:
            raise _no_program("ssh", "openssh-client") from exc

    def _start_master(self) -> None:
        argv = [*self._ssh_argv(master=True), "-N", "-f", "--", self.destination]
        timeout = max(30.0, 3 * self.connect_timeout_s)
        try:
            result = self._run_ssh(argv, timeout=timeout)
        except CommandTimeout as exc:
            raise HostUnreachable(
                f"{self._where} did not complete the ssh login within {timeout:g} s: "
                "check the network, a VPN or ProxyJump settings",
                host=self.host,
                command=argv,
                stderr=exc.stderr,
            ) from exc
        if result.returncode != 0:
            stderr = result.stderr.decode("utf-8", "replace")
            raise self.connection_error(stderr, command=argv, returncode=result.returncode) or (
                TransportError(
                    f"could not open an ssh connection to {self._where}",
                    host=self.host,
                    command=argv,
                    returncode=result.returncode,
                    stderr=stderr,
                )
            )
        self.connections_opened += 1
        self._opened_master = True
        pid = self._check_master()
        if pid is None:
            raise TransportError(
                f"the ssh master connection to {self._where} started but does not answer on "
                f"{self.control_path}",
                host=self.host,
                command=argv,
                stderr=result.stderr.decode("utf-8", "replace"),
            )
        logger.debug("ssh master to %s opened, pid %d (%s)", self._where, pid, self.control_path)

    def _check_master(self) -> int | None:
        argv = [*self._ssh_argv(master=False), "-O", "check", "--", self.destination]
        result = self._run_ssh(argv, timeout=30)
        found = re.search(rb"pid=(\d+)", result.stderr)
        return int(found.group(1)) if result.returncode == 0 and found else None

    def _ensure_master(self) -> None:
        with self._lock:
            if self._closed:
                raise TransportError(f"the transport to {self._where} is closed", host=self.host)
            if self._master_ready and os.path.exists(self.control_path):
                return
            ensure_private_dir(self.control_dir)
            # other processes may be opening the same master: without this lock a
            # second "ssh -M -N -f" would find the socket taken and stay on as a
            # plain connection that nobody uses and nothing ends
            fd = os.open(self.control_path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.path.exists(self.control_path):
                    # another transport or process opened it; or a dead master left it
                    if self._check_master() is not None:
                        self._master_ready = True
                        return
                    try:
                        os.unlink(self.control_path)
                    except FileNotFoundError:
                        pass
                self._start_master()
                self._master_ready = True
            finally:
                os.close(fd)  # releases the lock

    def _master_lost(self, attempt: int) -> None:
        with self._lock:
            if self._check_master() is not None:
                # alive, but it refused the session (the server's MaxSessions): wait
                time.sleep(0.05 * 2**attempt)
            else:
                self._master_ready = False

    def master_pid(self) -> int | None:
        """The pid of the master ssh process (``ssh -O check``), or None if none runs."""
        if not os.path.exists(self.control_path):
            return None
        return self._check_master()

    def connection_error(
        self, stderr: str, *, command: Sequence[str], returncode: int | None
    ) -> TransportError | None:
        """The TransportError for ssh's own failure text, or None if it is not one."""
        kind = parse_ssh_failure(stderr)
        if kind is None:
            return None
        where, name = self._where, self.destination.rsplit("@", 1)[-1]
        port = f"-p {self.port} " if self.port else ""
        cls: type[TransportError]
        if kind == "hostkey-changed":
            cls, message = (
                HostKeyError,
                (
                    f"the host key of {where} has CHANGED since it was recorded: the host was "
                    "reinstalled, or someone is in between. Check with its administrator, then "
                    f"remove the old key with `ssh-keygen -R {name}` and connect once by hand "
                    f"(`ssh {port}{self.destination}`)"
                ),
            )
        elif kind == "hostkey-unknown":
            cls, message = (
                HostKeyError,
                (
                    f"the host key of {where} is not known, and elsewhere never accepts one "
                    f"unseen (BatchMode). Add it after checking its fingerprint: "
                    f"`ssh-keyscan {port}{name} >> ~/.ssh/known_hosts`, or connect once by hand "
                    f"(`ssh {port}{self.destination}`)"
                ),
            )
        elif kind == "auth":
            cls, message = (
                AuthenticationError,
                (
                    f"{where} refused the login: check the user name and your key (`ssh-add -l` "
                    "lists the keys the agent offers; the public key must be in "
                    "~/.ssh/authorized_keys there). Password and passphrase prompts are off "
                    "(BatchMode=yes): load the key into ssh-agent first"
                ),
            )
        else:
            cls = HostUnreachable
            message = {
                "resolve": f"the host name of {where} is not known: check the spelling, "
                "or the Host entries in your ssh config",
                "refused": f"nothing accepts ssh connections at {where}: is sshd running, "
                "and is the port right?",
                "timeout": f"{where} did not answer within {self.connect_timeout_s:g} s: "
                "check the network, a VPN, a firewall or ProxyJump settings",
                "route": f"there is no network route to {where}: check the network or VPN",
                "closed": f"{where} closed the ssh connection: the server may be overloaded "
                "(MaxStartups), may refuse this client, or the network dropped it",
            }[kind]
        return cls(
            message, host=self.host, command=list(command), returncode=returncode, stderr=stderr
        )

    # --- commands -----------------------------------------------------------------------

    def _client_argv(self, line: str) -> list[str]:
        return [*self._ssh_argv(master=False), "-T", "--", self.destination, line]

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
        """Run ``argv`` on the host over the shared connection.

        The words reach the command exactly as given (each is shlex-quoted for
        the remote login shell). ``env`` is added to the remote environment.

        Raises:
            HostUnreachable, AuthenticationError, HostKeyError: ssh could not connect.
            CommandTimeout: past ``timeout`` seconds; the local ssh client is killed,
                and the remote command too where the host has coreutils ``timeout``.
            CommandNotFound, CommandFailed: from ``check()`` when ``check`` is true.
        """
        words = check_argv(argv)
        line = build_remote_command(words, env=env, cwd=cwd, timeout=timeout)
        for attempt in range(5):
            self._ensure_master()
            with self._sessions:
                result = self._run_ssh(
                    self._client_argv(line), timeout=timeout, input=input, command=words
                )
            if result.returncode == 255 and _NO_MASTER.encode() in result.stderr:
                self._master_lost(attempt)
                continue
            break
        else:
            raise HostUnreachable(
                f"the ssh connection to {self._where} keeps failing", host=self.host, command=words
            )
        if result.returncode == 255:
            error = self.connection_error(
                result.stderr.decode("utf-8", "replace"), command=words, returncode=255
            )
            if error is not None:
                raise error
        return result.check() if check else result

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
        """Start ``argv`` on the host; the returned local ssh process carries its pipes.

        Exit code 255 with ssh's error text means the connection failed:
        :meth:`connection_error` turns that text into the right exception.
        """
        line = build_remote_command(argv, env=env, cwd=cwd)
        self._ensure_master()
        try:
            return subprocess.Popen(
                self._client_argv(line),
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise _no_program("ssh", "openssh-client") from exc

    def close(self, *, keep_master: bool = False) -> None:
        """Stop the master this transport opened (unless ``keep_master``); later use raises.

        A kept master lives on for ``control_persist_s`` idle seconds, so that a
        new transport (or a later process) to the same host reuses it.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._opened_master and not keep_master and os.path.exists(self.control_path):
                argv = [*self._ssh_argv(master=False), "-O", "stop", "--", self.destination]
                try:
                    self._run_ssh(argv, timeout=30)
                except (TransportError, CommandNotFound) as exc:
                    logger.debug("stopping the ssh master to %s: %s", self._where, exc)

    # --- files ---------------------------------------------------------------------------

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
        from elsewhere.hosts.local import tree_functions

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
            try:
                result = run_process(
                    argv, input=None, timeout=None, env=None, cwd=None, host=self.host, command=argv
                )
            except FileNotFoundError as exc:
                raise _no_program("rsync", "rsync") from exc
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


def _check_option(option: str) -> str:
    if not isinstance(option, str) or option.startswith("-") or "\n" in option:
        raise ConfigError(f"ssh option {option!r}: give 'Key=value', as after ssh -o")
    if "=" not in option and " " not in option:
        raise ConfigError(f"ssh option {option!r}: give 'Key=value', as after ssh -o")
    return option


def _remote_parent(path: str) -> str | None:
    parent = os.path.dirname(path.rstrip("/"))
    return parent or None


def _no_program(name: str, package: str) -> CommandNotFound:
    return CommandNotFound(
        f"`{name}` is not installed here (or not on PATH): install it "
        f"(Debian/Ubuntu: apt-get install {package}; macOS has it)",
        command=[name],
    )


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
