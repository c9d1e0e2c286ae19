"""Communicating (MPI) jobs on ssh nodes: ``mpiexec`` on the first node, a host list of all.

:class:`SSHRanks` is the part of :class:`~elsewhere.backends.ssh.SSHCluster` that starts a
job's ranks together and watches the launcher (a mixin of it).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..util.paths import private_dir

if TYPE_CHECKING:
    from ..folder.handle import JobHandle
    from ..hosts.ssh import SSHTransport
    from ..hosts.sync import JobCopy
    from ..util.command import PythonCommand
    from .base import Cluster

    _Base = Cluster
else:
    _Base = object

class SSHRanks(_Base):
    """Ranks of a communicating job over the ssh nodes."""

    if TYPE_CHECKING:
        nodes: dict[str, int | None]

        def probe(self, host: str) -> dict[str, Any]: ...
        def transport(self, host: str) -> SSHTransport: ...
        def python_for(self, host: str) -> str: ...
        def command_for(self, host: str) -> PythonCommand: ...
        def copy_on(self, job: JobHandle, host: str, where: str) -> JobCopy: ...

    def submit_communicating(self, job: JobHandle) -> None:
        """Ranks started together by ``mpiexec`` on the first node, over every node.

        The job folder is copied to the same path on every node (the ranks'
        command line names it), and ``mpiexec --host`` lists each node's
        hostname with its slots; Open MPI reaches the other nodes with its own
        ssh, which must work between the nodes.
        """
        ranks = job.n_tasks
        hosts = list(self.nodes)
        infos = {h: self.probe(h) for h in hosts}
        first = hosts[0]
        rdir = f"{infos[first]['writable']}/{job.id}"
        slots = {h: (self.nodes[h] or infos[h]["free_cores"]) for h in hosts}
        with job.store.locked_queue() as q:
            q.submit(assigned=ranks, max_workers=ranks)
        private_dir(job.store.path / "files")
        for h in hosts:
            self.copy_on(job, h, rdir).push()
        launcher = str(self.additional_properties.get("mpi_launcher", "mpiexec")).split()
        argv = ["env", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", *launcher, "-n", str(ranks)]
        if len(hosts) > 1:
            # how the first node names the others: their own host names, or (with
            # additional_properties={"mpi_host_names": "destinations"}) the ssh destinations
            by_dest = self.additional_properties.get("mpi_host_names") == "destinations"
            names = {h: (h.split("@")[-1] if by_dest else infos[h].get("hostname", h)) for h in hosts}
            argv += ["--host", ",".join(f"{names[h]}:{slots[h]}" for h in hosts)]
        if ranks > sum(slots.values()) or launcher[0].endswith(("mpiexec", "mpirun")):
            argv.append("--oversubscribe")
        argv += [*self.additional_properties.get("mpi_args", []),
                 *self.command_for(first).argv("-m", "elsewhere.worker", "--job", rdir, "--mpi")]
        pid = self.transport(first).spawn(argv, log_path=f"{rdir}/logs/launcher.log", cwd=rdir + "/files")
        plan = {h: {"workers": 1, "dir": rdir, "tasks": [0, 0], "python": self.python_for(h),
                    "cores": slots[h], "last_seen": time.time()} for h in hosts}
        self.set_job_cluster_data(job, {"hosts": plan, "mpi": {"host": first, "pid": pid, "dir": rdir}})

    def _mpi_alive(self, mpi: dict[str, Any]) -> bool:
        res = self.transport(mpi["host"]).run(["kill", "-0", str(mpi["pid"])], check=False, timeout=30)
        return res.returncode == 0

    def _poll_mpi(self, job: JobHandle, data: dict[str, Any]) -> None:
        mpi = data["mpi"]
        for host, p in data["hosts"].items():
            self.copy_on(job, host, p["dir"]).pull()
        if self._mpi_alive(mpi):
            return
        for host, p in data["hosts"].items():  # the last words of every rank
            self.copy_on(job, host, p["dir"]).pull()
        self.report_lost(job, {r: f"rank {r} ended without a result: the MPI job on {mpi['host']} was aborted "
                                  "or killed (another rank failed? see job.log(rank) and logs/launcher.log)"
                               for r in range(job.n_tasks)})
