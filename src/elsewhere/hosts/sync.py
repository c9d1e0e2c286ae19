"""A job folder here and its copy on a host: push it up, pull what the workers wrote back.

Every backend whose workers do not see this machine's files (ssh nodes, a batch cluster's
``remote_storage=``) keeps a copy of the job folder on the host, and moves files the same
way, through one :class:`JobCopy`::

    push()          the folder up: over the host's agent session when there is one (every
                    file, one message each on a session already open; the bytes of files
                    sent earlier are skipped), else the transport's sync_up (rsync, or tar
                    through ssh: only files new or changed)
    push_growing()  an append-only file (payload.log) streamed while it is written
                    (agent session only)
    pull()          what workers write (WORKER_OUTPUT: journals, results, logs, worker
                    files) down, only files new or changed: the transport's sync_down
    pull_files()    the tasks' working folder (files/) down
    discard()       the copy removed from the host

Parents of the copy are made as needed on every path (the transports' sync_up makes them),
so no ``mkdir -p`` round trip goes before a push. Nothing is ever deleted by a pull.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from elsewhere.util.errors import ConfigError, RemoteSetupError
from elsewhere.util.paths import private_dir

if TYPE_CHECKING:
    from elsewhere.hosts.session import AgentSession
    from elsewhere.hosts.transport import Transport

__all__ = ["WORKER_OUTPUT", "JobCopy"]

#: What the workers of a job write into its folder: what comes back from a copy.
#: ``journal/_control.rec`` is this side's own (its cancels and reports): a copy's reapers write
#: theirs as ``_control.<id>.rec`` (``store.is_control``), and a stale copy of this side's,
#: pushed up with the folder, must not come back over it.
WORKER_OUTPUT: tuple[str, ...] = ("journal/[!_]*", "journal/_control.*.rec", "results/**", "logs/**", "workers/**",
                                  "damage.txt")


class JobCopy:
    """A job folder ``local_dir`` here and its copy ``remote_dir`` on the transport's host.

    Args:
        transport: the host (an :class:`~elsewhere.hosts.ssh.SSHTransport`, or a
            :class:`~elsewhere.hosts.local.LocalTransport` for another folder here).
        local_dir: the job folder here.
        remote_dir: the copy's folder there (absolute, or relative to the remote home).
        session: the host's agent session, when the caller has one open: pushes then go
            over it instead of starting rsync.
    """

    def __init__(
        self,
        transport: Transport,
        local_dir: str | os.PathLike[str],
        remote_dir: str,
        *,
        session: AgentSession | None = None,
    ) -> None:
        if not isinstance(remote_dir, str) or not remote_dir:
            raise ConfigError(f"a job copy needs a folder on {transport.host}, got {remote_dir!r}")
        self.transport = transport
        self.local_dir = Path(local_dir)
        self.remote_dir = remote_dir
        self.session = session

    def __repr__(self) -> str:
        via = ", session" if self.session is not None else ""
        return f"JobCopy({str(self.local_dir)!r} -> {self.transport.host}:{self.remote_dir!r}{via})"

    def push(self, *, sent: Mapping[str, int] | None = None) -> int | None:
        """Copy the job folder up (nothing there is deleted).

        Over the agent session every file goes, but the first ``sent[rel]`` bytes of the
        files named in ``sent`` (sent before, by :meth:`push_growing`); returns the bytes
        sent. Through the transport only files new or changed go; returns None.
        """
        if self.session is not None:
            return self.session.put_tree(self.local_dir, self.remote_dir, sent=dict(sent or {}))
        self.transport.sync_up(self.local_dir, self.remote_dir)
        return None

    def push_growing(
        self, rel: str, finished: threading.Event, present: Callable[[], bool]
    ) -> int:
        """Stream ``rel``, an append-only file of the folder, while it is written, until
        ``finished`` is set; returns the bytes sent (-1 when ``present()`` turned false: the
        writer gave up). Needs the agent session.
        """
        if self.session is None:
            raise ConfigError(f"streaming {rel} to {self.transport.host} needs its agent session")
        return self.session.put_growing(
            self.remote_dir, rel, self.local_dir / rel, finished, present
        )

    def pull(self, include: Sequence[str] = WORKER_OUTPUT) -> None:
        """Copy the files of the copy that match ``include`` (rsync-style patterns) and are
        new or changed into the job folder here."""
        self.transport.sync_down(self.remote_dir, self.local_dir, include=list(include))

    def pull_files(self) -> Path:
        """Copy what tasks wrote in their working folder there (``files/``) into the job
        folder's ``files/`` here; returns that folder."""
        dest = self.local_dir / "files"
        private_dir(dest)
        self.transport.sync_down(f"{self.remote_dir.rstrip('/')}/files", dest)
        return dest

    def discard(self) -> None:
        """Remove the copy from the host (by the agent when there is a session)."""
        if self.session is not None:
            answer = self.session.request("discard", dir=self.remote_dir, timeout_s=60)
            if "error" in answer:
                raise RemoteSetupError(
                    f"{self.transport.host}: {answer['error']}",
                    host=self.transport.host,
                    command=["discard", self.remote_dir],
                )
            return
        self.transport.run(["rm", "-rf", "--", self.remote_dir], timeout=60)
