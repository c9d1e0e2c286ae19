"""A long-lived ``python -m elsewhere.hosts.agent serve`` on a host, over one ssh session.

Who talks to whom::

    SSHCluster ── AgentSession.request(op) ──┐  JSON lines, and file bytes
               └─ AgentSession.put_*(...) ───┤  (os.sendfile) on ssh's stdin
                                             v
      ssh -T (a client of the master) ── master ── sshd ── login shell ── agent serve
                                             │
      answers "ELSEWHERE-AGENT {json}" <─────┘  on stdout, read with a deadline

The wire is described in :mod:`elsewhere.hosts.agent`. Opening a session costs one
remote login shell (hundreds of ms where ``~/.bashrc`` is busy); every later
request is a message on the open session. One thread at a time uses it (a
lock). A session idle for longer than ``idle_s`` is replaced before its next
request; the agent ends itself after four times that, so a client never
writes to an agent that is leaving, and a forgotten session does not hold one
of the server's ``MaxSessions`` for long.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from elsewhere.hosts.openssh import _NO_MASTER
from elsewhere.hosts.transport import CommandTimeout
from elsewhere.util.command import PythonCommand, PythonSpec
from elsewhere.util.errors import HostUnreachable, RemoteSetupError, TransportError

if TYPE_CHECKING:
    from elsewhere.hosts.ssh import SSHTransport

__all__ = ["AgentSession", "agent_error"]

MARKER = b"ELSEWHERE-AGENT "
WIRE_VERSION = 1
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# asking these twice does no harm (a poll reaps and tops up; the others only look or end)
_REPEATABLE = frozenset({"info", "poll", "cancel", "discard"})


def agent_error(host: str, python: str, argv: Sequence[str], returncode: int | None,
                stderr: str, stdout_tail: str = "") -> RemoteSetupError:
    """Why the agent did not answer on ``host``, in words that say what to do."""
    if returncode in (126, 127):
        cmd = PythonCommand.parse(python)
        said = (f"no Python {python!r} on {host}: install Python 3 there or give python= "
                "(per node: python={'host': '/path/to/python3'})") if cmd.plain else cmd.not_found(host)
        return RemoteSetupError(said, host=host, command=list(argv), returncode=returncode,
                                stderr=stderr)
    if "No module named" in stderr and "elsewhere" in stderr:
        from ..util.version import __version__

        return RemoteSetupError(
            f"elsewhere is not installed for {python} on {host}: run `{python} -m pip install "
            f"'elsewhere=={__version__}'` there, or give python= an interpreter that has it",
            host=host, command=list(argv), returncode=returncode, stderr=stderr)
    if "invalid choice: 'serve'" in stderr:
        from ..util.version import __version__

        return RemoteSetupError(
            f"the elsewhere for {python} on {host} is older than this one ({__version__}) and has "
            f"no `agent serve`: install the same version there", host=host, command=list(argv),
            returncode=returncode, stderr=stderr)
    return RemoteSetupError(f"the elsewhere agent failed on {host}", host=host, command=list(argv),
                            returncode=returncode, stderr=stderr + stdout_tail[-400:])


class _Ended(Exception):
    """The session's process ended (or its pipe broke) before the exchange finished."""


class AgentSession:
    """Requests to one agent on one host, all over one ssh session.

    Args:
        transport: the host's :class:`~elsewhere.hosts.ssh.SSHTransport`.
        python: the interpreter there that has elsewhere, or a command line that ends in it
            (``python=``: :class:`~elsewhere.util.command.PythonCommand`); the agent runs
            through it, and the workers it starts run in its environment.
        idle_s: replace the session before a request when it has been idle this long.

    Attributes:
        opened: sessions opened so far (each is one remote login shell).
    """

    def __init__(self, transport: SSHTransport, python: PythonSpec, *, idle_s: float = 30.0) -> None:
        self.transport = transport
        self.command = PythonCommand.parse(python)
        self.python = self.command.text
        self.idle_s = float(idle_s)
        self.argv = self.command.argv("-m", "elsewhere.hosts.agent", "serve", "--idle-s",
                                      str(int(4 * self.idle_s)))
        self.opened = 0
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._err: IO[bytes] | None = None
        self._buf = bytearray()
        self._answered = False
        self._last = 0.0
        self._next_id = 0
        self._finalizer: Any = None

    def __repr__(self) -> str:
        return f"AgentSession({self.transport.host!r}, open={self._proc is not None})"

    # -- the process ------------------------------------------------------------------
    def _open(self) -> None:
        self._err = tempfile.TemporaryFile()  # noqa: SIM115  (lives as long as the session)
        self._proc = self.transport.popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=self._err)
        assert self._proc.stdin is not None  # we asked for pipes
        try:  # fewer, larger writes for file bodies; not every system allows it
            fcntl.fcntl(self._proc.stdin.fileno(), _F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass
        self._buf = bytearray()
        self._answered = False
        self._last = time.monotonic()
        self.opened += 1
        self._finalizer = weakref.finalize(self, _shut, self._proc, self._err)

    def _ensure_open(self) -> None:
        if self._proc is not None:
            code = self._proc.poll()
            if code is not None or time.monotonic() - self._last > self.idle_s:
                self.close()
            if code == 255:
                # ssh itself ended the session: its master may be gone (killed, or the network
                # dropped it) while its socket file stays. Look before a new session rides on
                # it, or that session fails too and a third one is opened after a new master.
                self.transport._master_lost(0)
        if self._proc is None:
            self._open()

    def close(self) -> None:
        """End the session (the agent exits at the end of its input)."""
        with self._lock:
            if self._finalizer is not None:
                self._finalizer()
            self._proc = None
            self._err = None

    def _failure(self, what: str) -> TransportError:
        """The error for a session that ended: ssh's own failure, or the agent's."""
        proc, err = self._proc, self._err
        assert proc is not None and err is not None
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
        tail = self._buf.decode("utf-8", "replace")
        self.close()
        if code == 255:
            found = self.transport.connection_error(stderr, command=self.argv, returncode=255)
            if found is not None:
                return found
        if code == 255 or (code == 0 and not stderr):
            return TransportError(f"the ssh session to {self.transport.host} ended during {what}",
                                  host=self.transport.host, command=self.argv, returncode=code,
                                  stderr=stderr)
        return agent_error(self.transport.host, self.python, self.argv, code, stderr, tail)

    # -- writing ------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        fd = self._proc.stdin.fileno()
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _Ended() from exc

    def _send_file(self, src: int, offset: int, count: int) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        fd = self._proc.stdin.fileno()
        end = offset + count
        try:
            while offset < end:
                try:
                    sent = os.sendfile(fd, src, offset, min(end - offset, 1 << 24))
                except OSError as exc:
                    if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                        raise
                    sent = 0
                if sent == 0:  # no sendfile to a pipe here, or the file shrank: by hand
                    block = os.pread(src, min(end - offset, 1 << 20), offset)
                    if not block:
                        raise TransportError(f"a file shrank while it was being sent to "
                                             f"{self.transport.host}", host=self.transport.host)
                    self._write(block)
                    sent = len(block)
                offset += sent
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _Ended() from exc

    def _header(self, op: str, fields: dict[str, Any]) -> tuple[int, bytes]:
        self._next_id += 1
        req = {"v": WIRE_VERSION, "id": self._next_id, "op": op, **fields}
        return self._next_id, json.dumps(req).encode() + b"\n"

    # -- reading ------------------------------------------------------------------------
    def _read_answer(self, want: int, op: str, deadline: float) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, _, rest = bytes(self._buf).partition(b"\n")
                self._buf = bytearray(rest)
                if not line.startswith(MARKER):
                    continue  # a login banner, or what a login script printed
                try:
                    ans = json.loads(line[len(MARKER):])
                except ValueError:
                    continue
                if not isinstance(ans, dict):
                    continue
                if ans.get("id") is None and "error" in ans:
                    raise TransportError(f"the agent on {self.transport.host} refused a request: "
                                         f"{ans['error']}", host=self.transport.host, command=self.argv)
                if ans.get("id") == want:
                    ans.pop("id")
                    return ans
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise CommandTimeout(
                    f"the agent on {self.transport.host} did not answer {op!r} within "
                    f"{deadline - self._last:.0f} s", host=self.transport.host, command=self.argv)
            data = os.read(fd, 1 << 16)
            if not data:
                raise _Ended()
            if len(self._buf) > 1 << 22:  # a chatty login script: keep the tail only
                del self._buf[: -(1 << 16)]
            self._buf += data

    # -- the operations -----------------------------------------------------------------
    def request(self, op: str, *, timeout_s: float = 120.0, **fields: Any) -> dict[str, Any]:
        """Send ``op`` with ``fields``, return the agent's answer (a dict).

        An answer with ``"error"`` is returned as it is: the caller knows what
        the op meant. Raises HostUnreachable (and the other TransportErrors) when
        ssh cannot connect, RemoteSetupError when the agent cannot run there,
        CommandTimeout when no answer comes within ``timeout_s`` (the session is
        then closed, and the next request opens a new one).
        """
        with self._lock:
            for attempt in range(4):
                self._ensure_open()
                fresh = not self._answered
                want, head = self._header(op, fields)
                self._last = time.monotonic()
                try:
                    self._write(head)
                    ans = self._read_answer(want, op, self._last + timeout_s)
                except _Ended:
                    err = self._failure(op)
                    # The master went away before this session reached the agent (nothing
                    # ran), or the connection broke under an open session and the op may be
                    # asked again (the next poll would do the same): a new master, a new session.
                    lost = _NO_MASTER in (err.stderr or "") if fresh else (
                        op in _REPEATABLE and err.returncode == 255
                        and type(err) in (TransportError, HostUnreachable))
                    if lost and attempt < 3:
                        self.transport._master_lost(attempt)
                        continue
                    raise err from None
                except CommandTimeout:
                    self.close()
                    raise
                self._answered = True
                self._last = time.monotonic()
                return ans
            raise AssertionError("unreachable")  # pragma: no cover

    def put_file(self, directory: str, rel: str, local: str | os.PathLike[str], *,
                 offset: int = 0, size: int | None = None, final: bool = True) -> int:
        """Send ``local`` (its first ``size`` bytes) from ``offset`` on as ``directory/rel``.

        Returns the bytes sent. With ``final``, its mode and mtime go too (as
        rsync -pt keeps them).
        """
        with self._lock:
            fd = os.open(local, os.O_RDONLY)
            try:
                st = os.fstat(fd)
                count = max(0, (st.st_size if size is None else size) - offset)
                fields: dict[str, Any] = {"dir": directory, "path": rel, "offset": offset,
                                          "body": count, "truncate": offset == 0}
                if final:
                    fields.update(mode=st.st_mode & 0o7777, mtime=st.st_mtime)
                self._put(fields, lambda: self._send_file(fd, offset, count))
                return count
            finally:
                os.close(fd)

    def _put(self, fields: dict[str, Any], body: Callable[[], None] | None = None) -> None:
        self._ensure_open()
        _, head = self._header("put", fields)
        self._last = time.monotonic()
        try:
            self._write(head)
            if body is not None:
                body()
        except _Ended:
            raise self._failure("a file copy") from None

    def put_tree(self, local_root: str | os.PathLike[str], directory: str, *,
                 sent: dict[str, int] | None = None) -> int:
        """Send the folder ``local_root`` into ``directory`` there; return the bytes sent.

        ``sent``: files whose first bytes went already (``{rel: bytes}``): only the rest goes.
        """
        root = os.fspath(local_root)
        sent = sent or {}
        total = 0
        with self._lock:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                rel_dir = os.path.relpath(dirpath, root)
                rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
                if rel_dir:
                    self._put({"dir": directory, "path": rel_dir.rstrip("/"), "kind": "dir"})
                for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                    path = os.path.join(dirpath, name)
                    if os.path.islink(path):
                        self._put({"dir": directory, "path": rel_dir + name, "kind": "link",
                                   "target": os.readlink(path)})
                    elif os.path.isfile(path):
                        total += self.put_file(directory, rel_dir + name, path,
                                               offset=sent.get(rel_dir + name, 0))
        return total

    def put_growing(self, directory: str, rel: str, local: Path, finished: threading.Event,
                    present: Callable[[], bool]) -> int:
        """Send ``local`` as it grows (an append-only file being written), until ``finished``.

        Returns the bytes sent; the caller sends the rest (and the file's mode and
        mtime) with :meth:`put_file`. Stops early, returning -1, when ``present()``
        turns false (the writer gave up and removed its folder).
        """
        done = 0
        while True:
            last_round = finished.is_set()  # before the size: the size read after it is final
            if not present():
                return -1
            try:
                size = local.stat().st_size
            except FileNotFoundError:
                size = 0
            if size > done:
                self.put_file(directory, rel, local, offset=done, size=size, final=False)
                done = size
            elif last_round:
                return done
            else:
                finished.wait(0.01)  # the writer is pickling: look again soon


def _shut(proc: subprocess.Popen[bytes], err: IO[bytes] | None) -> None:
    """End a session's process: its input closes, the agent exits, ssh follows."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=0.5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for stream in (proc.stdout, err):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass
