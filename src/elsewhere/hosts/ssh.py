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

This module is the connection; the command lines and ssh's failure messages are
:mod:`elsewhere.hosts.openssh`, and the file copies (rsync, else tar streams) are
:mod:`elsewhere.hosts.sshcopy`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import re
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from elsewhere.hosts.openssh import (
    _MUX_ONLY_PROXY,
    _NO_MASTER,
    _SAFE_DIR,
    _SOCKET_PATH_MAX,
    AES_FIRST,
    _check_option,
    _no_program,
    build_remote_command,
    build_rsync_rsh,
    check_destination,
    choose_ciphers,
    default_control_dir,
    describe_ssh_failure,
    ensure_private_dir,
    login_failure_since,
    note_login_failure,
    parse_ssh_config_dump,
    parse_ssh_failure,
)
from elsewhere.hosts.sshcopy import SSHCopies
from elsewhere.hosts.transport import (
    BaseTransport,
    CommandTimeout,
    CompletedCommand,
    StreamSpec,
    check_argv,
    run_process,
)
from elsewhere.util.errors import CommandNotFound, ConfigError, HostUnreachable, TransportError
from elsewhere.util.system import aes_in_hardware

__all__ = [
    "SSHTransport",
    "build_remote_command",
    "build_rsync_rsh",
    "parse_ssh_failure",
]

logger = logging.getLogger(__name__)

# the Debian package that brings a program we run here
_PACKAGES = {"ssh": "openssh-client", "rsync": "rsync"}



_CIPHERS: dict[str, str | None] = {}  # SSHTransport._cipher_option's answers, by configuration


def _dump_config(args: list[str]) -> dict[str, str] | None:
    """``ssh -G ARGS``: the configuration ssh would use, without connecting; None if ssh
    refuses (an option it does not know) or cannot run."""
    try:
        out = subprocess.run(["ssh", "-G", *args], capture_output=True, text=True, timeout=10,
                             stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_ssh_config_dump(out.stdout) if out.returncode == 0 else None

class SSHTransport(SSHCopies, BaseTransport):
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
        if master:
            ciphers = self._cipher_option()
            if ciphers:
                opts.append(ciphers)
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

    def _cipher_option(self) -> str | None:
        """``Ciphers=`` with AES-GCM first for the master connection, where the CPU has AES
        instructions and neither the user's options nor their ssh configuration name
        ciphers (``openssh.choose_ciphers``); asked of ``ssh -G`` once per process."""
        if not aes_in_hardware() or any(o.lower().startswith("ciphers") for o in self.ssh_options):
            return None
        user = ["-F", self.ssh_config] if self.ssh_config else []
        for opt in self.ssh_options:
            user += ["-o", opt]
        if self.port:
            user += ["-p", str(self.port)]
        key = json.dumps([user, self.destination])
        if key not in _CIPHERS:
            bare = ["-F", os.devnull]
            _CIPHERS[key] = choose_ciphers(_dump_config([*bare, "x"]),
                                           _dump_config([*bare, "-o", f"Ciphers={AES_FIRST}", "x"]),
                                           _dump_config([*user, "--", self.destination]))  # fmt: skip
        return _CIPHERS[key]

    def _run_ssh(
        self,
        argv: list[str],
        *,
        timeout: float | None,
        input: bytes | None = None,
        command: Sequence[str] | None = None,
        program: str = "ssh",
    ) -> CompletedCommand:
        """Run ``argv`` (ssh, or rsync through it) here; ``program`` names what is missing
        when it cannot start."""
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
            raise _no_program(program, _PACKAGES.get(program, program)) from exc

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
            # plain connection that nobody uses and nothing ends. A login that fails is
            # noted in the lock file: those that waited for it fail with it at once, not
            # each after a timeout of its own in turn
            asked = time.time()
            fd = os.open(self.control_path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                failed = login_failure_since(fd, asked, self.host)
                if failed is not None:
                    raise failed
                if os.path.exists(self.control_path):
                    # another transport or process opened it; or a dead master left it
                    if self._check_master() is not None:
                        self._master_ready = True
                        return
                    try:
                        os.unlink(self.control_path)
                    except FileNotFoundError:
                        pass
                try:
                    self._start_master()
                except TransportError as exc:
                    note_login_failure(fd, exc)
                    raise
                os.ftruncate(fd, 0)
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
        cls, message = describe_ssh_failure(
            kind,
            destination=self.destination,
            port=self.port,
            connect_timeout_s=self.connect_timeout_s,
        )
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
