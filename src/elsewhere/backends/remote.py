"""Remote submission for any backend: commands on a login node, a job folder without a shared
file system.

:class:`RemoteCluster` is a :class:`~elsewhere.Cluster` that adds the four settings of MATLAB's
remote submission, the same for the batch backend and for a user's own plugin:

``host``            run the backend's commands on this host over ssh (a login node);
                    None: here
``remote_storage``  the job folders' place on that host when it does not see this
                    machine's files: each job folder is copied there before its workers
                    start, and what they write is brought back (no shared file system)
``ssh_options``     extra options of the ssh command (``["-p", "2222"]``)
``ssh_config``      an ssh config file to use instead of ``~/.ssh/config``

A subclass runs its commands with :meth:`RemoteCluster.run_command` (here or there), starts
its workers on ``worker_dir(job)`` (the job folder as the workers see it), calls
``mirror_up(job)`` before it starts them and ``mirror_down(job)`` in ``poll`` (both do
nothing without ``remote_storage``), and ``discard_copy(job)`` in ``delete_job``. The
transport (OpenSSH, one multiplexed connection per host) and the copies
(:class:`~elsewhere.hosts.sync.JobCopy`) come from the hosts layer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..util.errors import CommandNotFound, ConfigError, SchedulerError
from ..util.paths import private_dir
from .base import Cluster, option_file

if TYPE_CHECKING:
    from ..folder.handle import JobHandle
    from ..hosts.sync import JobCopy
    from ..hosts.transport import CompletedCommand, Transport


class RemoteCluster(Cluster):
    """A cluster whose commands run here or on a login node, with job folders there when it
    shares no file system with this machine (see the module's table of settings).

    Args:
        host: run commands on this host over ssh (``user@login.cluster.org``, or a name of
            ``~/.ssh/config``); None: on this machine.
        remote_storage: where job folders go on ``host`` when it does not see this
            machine's files (needs ``host``); they are mirrored both ways.
        ssh_options: extra options of ``ssh``.
        ssh_config: an ssh config file instead of ``~/.ssh/config``.

    The other settings are those of every cluster (cores_per_task, storage,
    additional_properties).
    """

    def __init__(
        self,
        *,
        host: str | None = None,
        remote_storage: str | None = None,
        ssh_options: Sequence[str] = (),
        ssh_config: str | None = None,
        **common: Any,
    ) -> None:
        super().__init__(**common)
        if host is not None and (not isinstance(host, str) or not host.strip()):
            raise ConfigError(f"host must be a host name (or user@host), not {host!r}")
        if remote_storage and not host:
            raise ConfigError("remote_storage= needs host= (the login node that sees it)")
        if remote_storage is not None and (not isinstance(remote_storage, str) or not remote_storage):
            raise ConfigError(f"remote_storage must be a folder on the host, not {remote_storage!r}")
        if not isinstance(ssh_options, (list, tuple)) or not all(isinstance(o, str) for o in ssh_options):  # fmt: skip
            raise ConfigError(f"ssh_options must be a list of words, not {ssh_options!r}")
        self.host = host
        self.remote_storage = remote_storage
        self.ssh_options = list(ssh_options)
        self.ssh_config = option_file("ssh_config", ssh_config)
        self._transport: Transport | None = None

    def settings(self) -> dict[str, Any]:
        return {"host": self.host, "remote_storage": self.remote_storage, "ssh_options": self.ssh_options,
                "ssh_config": self.ssh_config, **super().settings()}  # fmt: skip

    def shares_filesystem(self) -> bool:
        """Workers see this machine's files unless the job folders live in ``remote_storage``."""
        return not self.remote_storage

    # -- commands ---------------------------------------------------------------------
    @property
    def transport(self) -> Transport:
        """Where the commands run: this machine, or ``host`` over OpenSSH."""
        if self._transport is None:
            if self.host:
                from ..hosts.ssh import SSHTransport

                self._transport = SSHTransport(self.host, ssh_options=self.ssh_options, ssh_config=self.ssh_config)
            else:
                from ..hosts.local import LocalTransport

                self._transport = LocalTransport()
        return self._transport

    def run_command(self, argv: list[str], *, check: bool = True, timeout: float = 120.0, cwd: str | None = None,
                    env: Mapping[str, str] | None = None) -> CompletedCommand:  # fmt: skip
        """Run ``argv`` here or on ``host`` (each word quoted for the remote shell); its result
        (``returncode``, ``stdout``, ``stderr``, ``text``). A command that is not installed
        there raises :class:`~elsewhere.CommandNotFound`; with ``check``, one that fails raises
        :class:`~elsewhere.SchedulerError` with its exit code and the tail of its output."""
        where = self.host or "this machine"
        try:
            res = self.transport.run(argv, check=False, timeout=timeout, cwd=cwd, env=dict(env or {}) or None)
        except FileNotFoundError as exc:
            raise CommandNotFound(f"{argv[0]!r} is not installed on {where}", command=argv) from exc
        if res.returncode == 127 or (res.returncode != 0 and b"No such file or directory" in res.stderr
                                     and argv[0].encode() in res.stderr):  # fmt: skip
            raise CommandNotFound(f"{argv[0]!r} is not installed on {where}", command=argv,
                                  returncode=res.returncode, stderr=res.stderr.decode(errors="replace"))
        if check and res.returncode != 0:
            err = res.stderr.decode(errors="replace")
            if not err.strip():
                err = res.text  # some tools say why on stdout
            raise SchedulerError(f"{argv[0]} failed on {where}", command=argv, returncode=res.returncode, stderr=err)
        return res

    # -- the job folder there ------------------------------------------------------------
    def worker_dir(self, job: JobHandle) -> str:
        """The job folder as the workers see it: its copy in ``remote_storage``, else here."""
        if self.remote_storage:
            return f"{self.remote_storage.rstrip('/')}/{job.id}"
        return str(job.path)

    def job_copy(self, job: JobHandle) -> JobCopy:
        """The job folder here and its copy there (see :class:`~elsewhere.hosts.sync.JobCopy`)."""
        from ..hosts.sync import JobCopy

        return JobCopy(self.transport, job.path, self.worker_dir(job))

    def mirror_up(self, job: JobHandle) -> None:
        """Copy the job folder to ``remote_storage`` (before its workers start); nothing
        without it."""
        if self.remote_storage:
            self.job_copy(job).push()

    def mirror_down(self, job: JobHandle) -> None:
        """Bring back what the workers wrote there (journals, results, logs); nothing without
        ``remote_storage``."""
        if self.remote_storage:
            self.job_copy(job).pull()

    def discard_copy(self, job: JobHandle) -> None:
        """Remove the job folder's copy there (``delete_job``); the folder here stays."""
        if self.remote_storage:
            self.job_copy(job).discard()

    def fetch_files(self, job: JobHandle) -> Path:
        """Bring back what tasks wrote in their working folder there (``job.get(files=True)``)."""
        dest = job.path / "files"
        if self.remote_storage:
            self.job_copy(job).pull_files()
        else:
            private_dir(dest)
        return dest


def clean_environment(prefixes: Sequence[str]) -> list[str]:
    """``env -u NAME ...`` words that drop this process's variables starting with ``prefixes``
    from a command run here (a scheduler's variables, when submitting from inside a job)."""
    leaky = sorted(k for k in os.environ if k.startswith(tuple(prefixes)))
    return ["env", *(w for k in leaky for w in ("-u", k))] if leaky else []
