"""ssh nodes (dMod2's sshNodes): workers on hosts reached with the user's OpenSSH.

    ew.ssh(["server1", "user@server2"])          every node with its free cores
    ew.ssh({"server1": 24, "server2": 20})       at most that many cores per node

Each node runs one ``python -m elsewhere.hosts.agent serve`` per client, over one
ssh session on the host's master connection, for the whole session: requests
are JSON lines on its stdin, so a probe, a start or a poll costs a message, not
a remote login shell. On submission, while the client still writes the
inputs, each node is asked for its Python, elsewhere version, cores and load,
and the payload is streamed into the node's copy of the job folder as it grows
(``payload.log`` is append-only); then the rest of the folder follows on the
same session, ``setup=`` runs there once, and detached workers start, which
survive the client going away. The tasks are split between nodes in
proportion to their workers, and each node's workers claim their share from
the node's own copy of the queue::

    submit ──prepare──> per node, a thread: info ─> payload.log as it grows ─┐
           ──writes payload.log, job.json, queue.json locally──────────────── │
           ──submit_independent: "finished" ─> rest of the folder ─> start <──┘

While a client waits, each poll asks the agent on every node (vanished
workers are written off there, replacements started) and mirrors new
results, logs and worker files down (rsync). A node that cannot be
reached for ``host_timeout_s`` is given up: its unfinished tasks move to the
other nodes (the first result of a task wins).
"""

from __future__ import annotations

import math
import shlex
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..util.command import PythonCommand
from ..util.errors import ConfigError, RemoteSetupError, TransportError
from ..util.paths import private_dir, write_private
from . import base
from .base import Cluster, Property, refuse_unknown
from .sshranks import SSHRanks

if TYPE_CHECKING:
    from ..folder.handle import JobHandle
    from ..hosts.session import AgentSession
    from ..hosts.ssh import SSHTransport
    from ..hosts.sync import JobCopy

DEFAULT_REMOTE_STORAGE = ".local/share/elsewhere/remote"


class SSHCluster(SSHRanks, Cluster):
    """Workers on hosts reached over ssh.

    Args:
        nodes: ssh destinations as typed in a shell ("host", "user@host", an
            alias of ~/.ssh/config), or a dict destination -> cores to use.
        cores_per_task: cores each task gets.
        python: the interpreter on the nodes, or a command line that ends in one
            ("apptainer exec img.sif python3", "module load python && python3", a list of
            words): one for all, or a dict per node (default "python3"). The agent and the
            workers run through it; see docs/ssh.md.
        remote_storage: where job copies go on the nodes (relative paths are
            under the remote home): one folder for all, or a dict per node. With
            several nodes each copy is ``<remote_storage>/<job id>-<node>``, so
            nodes that share a file system (an NFS home) never share a copy.
        setup: a shell command run once per node, in the job's files folder,
            before its tasks start (e.g. "make -C model", "pip install -e .").
        ssh_options: extra ``-o`` options for ssh; ssh_config: a config file.
        host_timeout_s: how long a node may be unreachable before its tasks move.
        storage: where job folders go on this machine (default ``<home>/jobs``).
        additional_properties: the settings of :attr:`properties` (the MPI launcher, its
            arguments, how it names the nodes).
    """

    kind = "ssh"
    properties = {
        "mpi_launcher": Property(str, None, "the MPI launcher command (default mpiexec)"),
        "mpi_args": Property(list, None, "extra arguments of the MPI launcher"),
        "mpi_host_names": Property(str, None, '"destinations": mpiexec --host names the ssh '
                                   'destinations, not the nodes\' own host names'),
    }
    capabilities = frozenset({"communicating", "fetch_files"})

    def __init__(
        self,
        nodes: list[str] | tuple[str, ...] | dict[str, int] | str,
        *,
        cores_per_task: int = 1,
        python: str | Sequence[str] | Mapping[str, str | Sequence[str]] | None = None,
        remote_storage: str | dict[str, str] = DEFAULT_REMOTE_STORAGE,
        setup: str | None = None,
        ssh_options: list[str] | tuple[str, ...] = (),
        ssh_config: str | None = None,
        host_timeout_s: float = 60.0,
        storage: str | Path | None = None,
        additional_properties: dict[str, Any] | None = None,
        **other: Any,
    ) -> None:
        refuse_unknown(self, other)  # as ew.slurm: a ConfigError naming the option, not a TypeError
        super().__init__(cores_per_task=cores_per_task, storage=storage,
                         additional_properties=additional_properties)
        if isinstance(nodes, str):
            nodes = [nodes]
        if not isinstance(nodes, (list, tuple, dict)):
            raise ConfigError(f"nodes must be an ssh destination ('host', 'user@host'), a list of them or a "
                              f"dict of destination -> cores, not {nodes!r}")  # fmt: skip
        if isinstance(nodes, dict):
            for host, cores in nodes.items():
                if not isinstance(cores, int) or cores < 1:
                    raise ConfigError(f"cores for node {host!r} must be a positive integer, not {cores!r}")
            self.nodes: dict[str, int | None] = dict(nodes)
        else:
            self.nodes = dict.fromkeys(nodes)
        if not self.nodes:
            raise ConfigError("ew.ssh needs at least one node")
        for host in self.nodes:
            if not isinstance(host, str) or not host or host.startswith("-") or any(c.isspace() for c in host):
                raise ConfigError(f"{host!r} is not an ssh destination")
        if isinstance(python, Mapping):
            unknown = set(python) - set(self.nodes)
            if unknown:
                raise ConfigError(f"python= names nodes that are not in the cluster: {sorted(unknown)}")
            self._commands = {h: PythonCommand.parse(p, option=f"python[{h!r}]") for h, p in python.items()}
            self._command = PythonCommand(("python3",))
        else:
            self._commands = {}
            self._command = PythonCommand.parse(python if python is not None else "python3")
        base.option_typed("remote_storage", remote_storage, (str, dict), "a folder or {node: path}")
        if isinstance(remote_storage, dict):
            unknown = set(remote_storage) - set(self.nodes)
            if unknown:
                raise ConfigError(f"remote_storage= names nodes that are not in the cluster: {sorted(unknown)}")
        self.python = python
        self.remote_storage = remote_storage
        self.setup = base.option_text("setup", setup)
        self.ssh_options = base.option_words("ssh_options", ssh_options)
        self.ssh_config = base.option_file("ssh_config", ssh_config)
        self.host_timeout_s = base.option_seconds("host_timeout_s", host_timeout_s)
        self._transports: dict[str, SSHTransport] = {}
        self._sessions: dict[str, AgentSession] = {}
        # job id -> (the inputs are written, per node: its probe and the bytes streamed)
        self._early: dict[str, tuple[threading.Event, dict[str, Future[Any]]]] = {}

    def settings(self) -> dict[str, Any]:
        return {
            "nodes": {h: c for h, c in self.nodes.items()} if any(self.nodes.values()) else list(self.nodes),
            "python": self.python, "remote_storage": self.remote_storage, "setup": self.setup,
            "ssh_options": self.ssh_options, "ssh_config": self.ssh_config,
            "host_timeout_s": self.host_timeout_s, **super().settings(),
        }

    def shares_filesystem(self) -> bool:
        return False

    # -- hosts ------------------------------------------------------------------
    def transport(self, host: str) -> SSHTransport:
        """The multiplexed connection to ``host`` (one per host per process)."""
        t = self._transports.get(host)
        if t is None:
            from ..hosts.ssh import SSHTransport

            t = SSHTransport(host, ssh_options=self.ssh_options, ssh_config=self.ssh_config)
            self._transports[host] = t
        return t

    def command_for(self, host: str) -> PythonCommand:
        """How ``host`` starts Python (its ``python=``)."""
        return self._commands.get(host, self._command)

    def python_for(self, host: str) -> str:
        """``host``'s ``python=`` as text (for messages and the job's cluster data)."""
        return self.command_for(host).text

    def storage_for(self, host: str) -> str:
        """The folder on ``host`` that holds job copies."""
        if isinstance(self.remote_storage, dict):
            return self.remote_storage.get(host, DEFAULT_REMOTE_STORAGE)
        return self.remote_storage

    def session(self, host: str) -> AgentSession:
        """The agent on ``host``, over one ssh session kept open (one per host per process)."""
        sess = self._sessions.get(host)
        if sess is None:
            from ..hosts.session import AgentSession

            sess = AgentSession(self.transport(host), self.command_for(host))
            self._sessions[host] = sess
        return sess

    def _agent(self, host: str, op: str, *, timeout: float = 120.0, **fields: Any) -> dict[str, Any]:
        answer = self.session(host).request(op, timeout_s=timeout, **fields)
        if "error" in answer:
            raise RemoteSetupError(f"{host}: {answer['error']}", host=host,
                                   command=self.command_for(host).argv("-m", "elsewhere.hosts.agent", op))
        return answer

    def probe(self, host: str) -> dict[str, Any]:
        """What ``host`` offers: python, elsewhere version, cores, load; checks the storage."""
        from ..util.version import __version__

        info = self._agent(host, "info", dir=self.storage_for(host), timeout=60)
        theirs = str(info.get("elsewhere_version", ""))
        if theirs.split(".")[0] != __version__.split(".")[0]:
            raise RemoteSetupError(
                f"{host} has elsewhere {theirs} for {self.python_for(host)}, this machine {__version__}: "
                "install the same major version there", host=host)
        if not info.get("writable"):
            raise RemoteSetupError(
                f"{host}: cannot write to {self.storage_for(host)}: {info.get('writable_error', '')} "
                "(give remote_storage= a writable folder)", host=host)
        self.transport(host).note_remote_rsync(bool(info.get("rsync")))  # no `which rsync` later
        from ..hosts.probe import HostProbe  # the node's probe; older agents send no free_cores

        info["free_cores"] = HostProbe.from_dict(info).free_cores
        return info

    # -- plugin operations ----------------------------------------------------
    def _each(self, fn: Any, hosts: list[str]) -> list[Any]:
        """``fn(host)`` for every host at once (each is mostly waiting on ssh)."""
        from concurrent.futures import ThreadPoolExecutor

        if len(hosts) == 1:
            return [fn(hosts[0])]
        with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as ex:
            return list(ex.map(fn, hosts))

    def prepare(self, job: JobHandle, n_tasks: int) -> None:
        """While the client writes the inputs: ask the nodes about themselves, and
        stream the payload into each node's copy as it is written."""
        finished = threading.Event()
        self._early[job.id] = (finished, {h: _background(self._early_copy, job, h, finished)
                                          for h in self.nodes})

    def _copy_dir(self, job: JobHandle, host: str, info: dict[str, Any]) -> str:
        # nodes may share a file system (an NFS home): never one copy for two nodes
        copy = job.id if len(self.nodes) == 1 else f"{job.id}-{_safe(host)}"
        return f"{info['writable']}/{copy}"

    def copy_on(self, job: JobHandle, host: str, where: str) -> JobCopy:
        """The job folder here and its copy ``where`` on ``host`` (over the host's agent session)."""
        from ..hosts.sync import JobCopy

        return JobCopy(self.transport(host), job.store.path, where, session=self.session(host))

    def _early_copy(self, job: JobHandle, host: str, finished: threading.Event) -> tuple[dict[str, Any], int]:
        info = self.probe(host)
        copy = self.copy_on(job, host, self._copy_dir(job, host, info))
        sent = copy.push_growing("payload.log", finished, job.store.path.exists)
        if sent < 0:  # the client gave up (the inputs could not be written): leave nothing there
            self._early.pop(job.id, None)
            copy.discard()
            sent = 0
        return info, sent

    def submit_independent(self, job: JobHandle) -> None:
        """Copy the job folder to each node and start workers there, each node running its
        share from a queue of its own; on a retry (the job was submitted), each node that
        holds tasks to run again is told to run them."""
        if job.store.queue().submitted:
            self._rerun(job, job.tasks)
            return
        n = job.n_tasks
        private_dir(job.store.path / "files")
        plan: dict[str, dict[str, Any]] = {}
        early = self._early.pop(job.id, None)
        if early is not None:
            early[0].set()  # the inputs are written: each node gets the rest of the folder
            got = {h: f.result() for h, f in early[1].items()}  # a node's error is raised here
        else:
            got = dict(zip(self.nodes, self._each(lambda h: (self.probe(h), 0), list(self.nodes))))
        for host, asked in self.nodes.items():
            info = got[host][0]
            free = info["free_cores"]
            cores = asked if asked is not None else free
            if asked is not None and asked > free:
                warnings.warn(f"{host}: asked for {asked} cores, {free} are free now; using {free}",
                              stacklevel=3)
                cores = free
            workers = max(1, cores // self.cores_per_task)
            plan[host] = {"workers": workers, "dir": self._copy_dir(job, host, info),
                          "python": self.python_for(host), "cores": cores}
        total = sum(p["workers"] for p in plan.values())
        start = 0
        hosts = list(plan)
        for i, host in enumerate(hosts):
            share = n - start if i == len(hosts) - 1 else round(n * plan[host]["workers"] / total)
            plan[host]["tasks"] = [start, start + share]
            plan[host]["workers"] = max(1, min(plan[host]["workers"], share)) if share else 0
            start += share
        with job.store.locked_queue() as q:
            q.submit(assigned=n)
        data = {"hosts": plan}
        self.set_job_cluster_data(job, data)
        busy = [h for h, p in plan.items() if p["workers"]]
        for h in plan:
            if h not in busy and got[h][1]:
                self.copy_on(job, h, plan[h]["dir"]).discard()
        self._each(lambda h: self._place(job, h, plan[h], got[h][1]), busy)
        for h in busy:
            plan[h]["last_seen"] = time.time()
        self.set_job_cluster_data(job, data)

    def _holder(self, hosts: dict[str, Any], task: int) -> str | None:
        """The node whose copy of the job holds ``task`` now (a task moved off an abandoned
        node is held by the node it moved to)."""
        for host, p in hosts.items():
            if task in p.get("moved_in", ()):
                return host
        for host, p in hosts.items():
            a, b = p.get("tasks", (0, 0))
            if a <= task < b and not p.get("abandoned"):
                return host
        return None

    def _rerun(self, job: JobHandle, tasks: list[int]) -> None:
        """Tell the nodes that hold ``tasks`` to run them again, with their new attempts."""
        data = self.get_job_cluster_data(job)
        hosts = data.get("hosts", {})
        by_host: dict[str, dict[str, int]] = {}
        for t in tasks:
            h = self._holder(hosts, t)
            if h is None:
                raise TransportError(f"no reachable node holds task {t} of job {job.name!r} to run it again")
            by_host.setdefault(h, {})[str(t)] = job.attempt(t)
        for h, attempts in by_host.items():
            self._agent(h, "retry", job=hosts[h]["dir"], attempts=attempts, workers=hosts[h]["workers"])
            hosts[h]["done"] = False
        self.set_job_cluster_data(job, data)

    def cancel_task(self, job: JobHandle, index: int) -> None:
        """Tell the node that holds task ``index`` to cancel it (its worker running it, if
        any, is stopped; the node's other tasks go on)."""
        hosts = self.get_job_cluster_data(job).get("hosts", {})
        h = self._holder(hosts, index)
        if h is not None:
            self._agent(h, "cancel_task", job=hosts[h]["dir"], task=index, timeout=60)

    def _place(self, job: JobHandle, host: str, p: dict[str, Any], streamed: int) -> None:
        # the rest of the folder on the agent's session (files/ included), then start there
        self.copy_on(job, host, p["dir"]).push(sent={"payload.log": streamed})
        a, b = p["tasks"]
        if self.setup:
            t = self.transport(host)
            files = shlex.quote(p["dir"] + "/files")
            res = t.run_shell(f"mkdir -p {files} && cd {files} && {self.setup}", check=False, timeout=3600)
            log = job.store.path / "logs" / f"setup-{_safe(host)}.log"
            write_private(log, res.stdout + res.stderr)
            if res.returncode != 0:
                raise RemoteSetupError(
                    f"setup failed on {host}; its output is in {log}", host=host,
                    command=["sh", "-c", self.setup], returncode=res.returncode,
                    stderr=res.stderr.decode(errors="replace"))
        self._agent(host, "start", job=p["dir"], workers=p["workers"], tasks=f"{a}:{b}",
                    retries=int(job.spec.get("retries", 0)))

    def poll(self, job: JobHandle) -> None:
        data = self.get_job_cluster_data(job)
        hosts = data.get("hosts", {})
        if not hosts or job.store.queue().cancelled:
            return
        if "mpi" in data:
            self._poll_mpi(job, data)
            return
        changed = False
        merged: dict[str, Any] = {"lost_by": {}, "lost_reason": {}, "lost_ranges": [], "members": {}}
        asked = [(h, p) for h, p in hosts.items()
                 if p.get("workers") and not p.get("abandoned") and not p.get("done")]
        # a node that does not answer must not hold up the others, nor for longer than
        # host_timeout_s: all nodes at once, each bounded
        limit = max(5.0, min(60.0, self.host_timeout_s))

        def ask(host: str, p: dict[str, Any]) -> tuple[dict[str, Any] | None, TransportError | None]:
            try:
                ans = self._agent(host, "poll", job=p["dir"], workers=p["workers"], timeout=limit)
                self.copy_on(job, host, p["dir"]).pull()
            except TransportError as exc:
                return None, exc
            return ans, None

        if len(asked) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(len(asked)) as pool:
                answers = list(pool.map(lambda hp: ask(*hp), asked))
        else:
            answers = [ask(*hp) for hp in asked]
        for (host, p), (ans, exc) in zip(asked, answers):
            if ans is None:
                if time.time() - p.get("last_seen", time.time()) > self.host_timeout_s:
                    self._abandon(job, host, p, hosts, str(exc).splitlines()[0])
                    changed = True
                continue
            p["last_seen"] = time.time()
            changed = True
            qs = ans.get("queue", {})
            merged["lost_by"].update(qs.get("lost_by") or {})
            merged["lost_reason"].update(qs.get("lost_reason") or {})
            merged["lost_ranges"] += qs.get("lost_ranges") or []  # a node's halted or failed workers' tasks
            merged["members"].update(qs.get("members") or {})
            if ans.get("work") == 0 and ans.get("live") == 0:
                p["done"] = True
        if changed:
            self.set_job_cluster_data(job, data)
        with job.store.locked_queue() as q:
            q.adopt(members=merged["members"], lost_by=merged["lost_by"], lost_reason=merged["lost_reason"],
                    lost_ranges=merged["lost_ranges"])

    def _abandon(self, job: JobHandle, host: str, p: dict[str, Any], hosts: dict[str, Any], why: str) -> None:
        job.refresh()
        a, b = p["tasks"]
        moved = [t for t in range(a, b) if t not in job.outcomes] + [
            t for t in p.get("moved_in", []) if t not in job.outcomes]
        p["abandoned"] = why
        others = [h for h, o in hosts.items() if h != host and not o.get("abandoned") and o.get("workers")]
        if not moved:
            return
        if not others:
            warnings.warn(f"{host} is unreachable ({why}) and no other node is left for its "
                          f"{len(moved)} unfinished tasks", stacklevel=2)
            return
        per = math.ceil(len(moved) / len(others))
        for i, h in enumerate(others):
            part = moved[i * per : (i + 1) * per]
            if part:
                self._agent(h, "add", job=hosts[h]["dir"], tasks=part)
                hosts[h].setdefault("moved_in", []).extend(part)
                hosts[h]["done"] = False

    def cancel_job(self, job: JobHandle) -> None:
        data = self.get_job_cluster_data(job)
        if "mpi" in data:  # the launcher leads its own session: stop it and every rank
            mpi = data["mpi"]
            t = self.transport(mpi["host"])
            for sig in ("TERM", "KILL"):
                t.run(["kill", f"-{sig}", "--", f"-{mpi['pid']}"], check=False, timeout=30)
                deadline = time.time() + 3
                while time.time() < deadline and self._mpi_alive(mpi):
                    time.sleep(0.1)
                if not self._mpi_alive(mpi):
                    break
            return
        for host, p in data.get("hosts", {}).items():
            if p.get("workers"):
                try:
                    self._agent(host, "cancel", job=p["dir"], timeout=60)
                except TransportError as exc:
                    warnings.warn(f"could not cancel on {host}: {exc}", stacklevel=2)

    def delete_job(self, job: JobHandle) -> None:
        if not job.state.done:
            self.cancel_job(job)
        for host, p in self.get_job_cluster_data(job).get("hosts", {}).items():
            if p.get("workers"):
                try:
                    self.copy_on(job, host, p["dir"]).discard()
                except TransportError as exc:
                    warnings.warn(f"could not remove the job copy on {host}: {exc}", stacklevel=2)

    def fetch_files(self, job: JobHandle) -> Path:
        """Bring back what tasks wrote in their working folder on each node."""
        dest = job.store.path / "files"
        private_dir(dest)
        for host, p in self.get_job_cluster_data(job).get("hosts", {}).items():
            if p.get("workers"):
                self.copy_on(job, host, p["dir"]).pull_files()
        return dest

    def close(self) -> None:
        for sess in self._sessions.values():
            sess.close()
        for t in self._transports.values():
            t.close(keep_master=True)


def _safe(host: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in host)


def _background(fn: Any, *args: Any) -> Future[Any]:
    """``fn(*args)`` in a daemon thread (a client that gives up must not wait for it at exit)."""
    fut: Future[Any] = Future()

    def run() -> None:
        fut.set_running_or_notify_cancel()
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # handed to whoever asks for the result
            fut.set_exception(exc)

    threading.Thread(target=run, daemon=True, name="elsewhere-ssh-prepare").start()
    return fut
