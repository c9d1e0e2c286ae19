"""Where the real test services are, and why one is missing.

``ci/services/up.sh`` installs and starts them (``scripts/test`` runs it as root on Debian);
this module only looks. Each service has a pair of functions::

    slurm() -> SlurmInfo | None      # None when it cannot be used
    why_no_slurm() -> str            # what is missing, "" when nothing is

and likewise ``sge``, ``torque``, ``mpi`` (plus ``why_no_mpi4py``), ``netns``, ``ssh`` and
``browser`` (Chromium with Playwright).
Every check is fast (well under a second), starts nothing and never raises, so a test module
can call it at import time. No pytest needed here::

    from tests import services

    pytestmark = pytest.mark.skipif(services.slurm() is None, reason=services.why_no_slurm())

The paths and ports below are the ones the scripts in ``ci/services/`` write; ``ci/README.md``
describes them.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CHROMIUM",
    "MpiInfo",
    "NetnsHost",
    "NetnsInfo",
    "SgeInfo",
    "SlurmInfo",
    "SshInfo",
    "TorqueInfo",
    "browser",
    "mpi",
    "netns",
    "sge",
    "slurm",
    "ssh",
    "torque",
    "why_no_browser",
    "why_no_mpi",
    "why_no_mpi4py",
    "why_no_netns",
    "why_no_sge",
    "why_no_slurm",
    "why_no_ssh",
    "why_no_torque",
]

_UP = "ci/services/up.sh"  # named in every reason: how to get the service


def _alive(pidfile: str | Path, comm: str) -> bool:
    """The pid file names a live process whose command name is ``comm``.

    Checks the name because pids get reused, and the state because an exited daemon stays a
    zombie until PID 1 reaps it (seconds, on these machines).
    """
    try:
        pid = int(Path(pidfile).read_text().split()[0])
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError, IndexError):
        return False
    name, _, rest = stat.partition("(")[2].rpartition(")")
    return name == comm and rest.split()[:1] != ["Z"]


def _port_open(port: int, host: str = "127.0.0.1", timeout_s: float = 0.3) -> bool:
    """A TCP connection to host:port is accepted (only ever loopback here)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _run(argv: list[str], env: dict[str, str] | None = None, timeout_s: float = 2.0) -> str | None:
    """Stdout of a quick client command, or None if it failed or took too long."""
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **(env or {})},
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


# ---------------------------------------------------------------- SLURM


@dataclass(frozen=True)
class SlurmInfo:
    """The single-node SLURM of ``ci/services/slurm.sh``.

    ``env`` holds SLURM_CONF (the default path anyway). ``accounting`` is ``"slurmdbd"`` (plain
    ``sacct`` works; records arrive a second or so after a job ends) or ``"none"`` (use
    ``sacct -c``, which reads ``jobcomp_log``). Finished jobs leave squeue about
    ``min_job_age_s`` + 5 s after they end. ``pmix``: ``srun --mpi=pmix`` works.
    """

    conf: Path
    host: str
    cpus: int
    partitions: tuple[str, ...]
    default_partition: str
    accounting: str
    jobcomp_log: Path
    max_array_size: int
    min_job_age_s: int
    pmix: bool
    env: dict[str, str] = field(default_factory=dict)


def _slurm_conf(path: Path) -> tuple[dict[str, str], list[dict[str, str]], list[dict[str, str]]]:
    """Parse slurm.conf into (settings, node lines, partition lines); keys as written."""
    settings: dict[str, str] = {}
    nodes: list[dict[str, str]] = []
    parts: list[dict[str, str]] = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if line.startswith("NodeName="):
            nodes.append(words)
        elif line.startswith("PartitionName="):
            parts.append(words)
        else:
            settings.update(words)
    return settings, nodes, parts


def _probe_slurm() -> tuple[SlurmInfo | None, str]:
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    if shutil.which("sbatch") is None:
        return None, f"SLURM is not installed (no sbatch on PATH): run {_UP} slurm as root"
    try:
        settings, nodes, parts = _slurm_conf(conf)
    except OSError as exc:
        return None, f"SLURM has no config ({conf}: {exc.strerror}): run {_UP} slurm as root"
    for pidfile, comm in (
        ("/run/munge/munged.pid", "munged"),
        (settings.get("SlurmctldPidFile", "/run/slurmctld.pid"), "slurmctld"),
        (settings.get("SlurmdPidFile", "/run/slurmd.pid"), "slurmd"),
    ):
        if not _alive(pidfile, comm):
            return (
                None,
                f"SLURM's {comm} is not running (pid file {pidfile}): run {_UP} slurm as root",
            )
    port = int(settings.get("SlurmctldPort", "6817"))
    if not _port_open(port):
        return None, f"slurmctld does not accept connections on 127.0.0.1:{port}"
    accounting = settings.get("AccountingStorageType", "accounting_storage/none").split("/")[-1]
    if accounting == "slurmdbd" and not _alive("/run/slurmdbd.pid", "slurmdbd"):
        return None, f"SLURM is configured for slurmdbd, which is not running: run {_UP} slurm"
    try:
        node = nodes[0]
        default = next(
            (p["PartitionName"] for p in parts if p.get("Default") == "YES"),
            parts[0]["PartitionName"],
        )
        info = SlurmInfo(
            conf=conf,
            host=node["NodeName"],
            cpus=int(node.get("CPUs", "1")),
            partitions=tuple(p["PartitionName"] for p in parts),
            default_partition=default,
            accounting=accounting,
            jobcomp_log=Path(settings.get("JobCompLoc", "/var/log/slurm/jobcomp.log")),
            max_array_size=int(settings.get("MaxArraySize", "1001")),
            min_job_age_s=int(settings.get("MinJobAge", "300")),
            pmix=any(Path("/usr/lib/x86_64-linux-gnu/slurm-wlm").glob("mpi_pmix*.so"))
            and any(Path("/usr/lib/x86_64-linux-gnu").glob("libpmix.so.2*")),
            env={"SLURM_CONF": str(conf)},
        )
    except (IndexError, KeyError, ValueError, StopIteration) as exc:
        return None, f"cannot read node and partitions from {conf}: {exc!r}"
    return info, ""


def slurm() -> SlurmInfo | None:
    """The running single-node SLURM, or None (then ``why_no_slurm()`` says why)."""
    return _probe_slurm()[0]


def why_no_slurm() -> str:
    """Why ``slurm()`` is None: what is missing and how to start it; "" when it runs."""
    return _probe_slurm()[1]


# ---------------------------------------------------------------- Grid Engine


@dataclass(frozen=True)
class SgeInfo:
    """The single-node Son of Grid Engine of ``ci/services/sge.sh``.

    Debian's ``/usr/bin/q*`` find the cell without ``env``, but jobs and tools may want it.
    Queue ``queue`` on ``host`` has ``slots`` slots; parallel environments ``pes``
    (``qsub -pe smp 2``). Finished jobs: ``qacct -j ID`` (``accounting_file``).
    """

    root: Path
    cell: str
    host: str
    queue: str
    slots: int
    pes: tuple[str, ...]
    qsub: Path
    accounting_file: Path
    env: dict[str, str] = field(default_factory=dict)


def _probe_sge() -> tuple[SgeInfo | None, str]:
    root, cell = Path("/var/lib/gridengine"), "default"
    env = {"SGE_ROOT": str(root), "SGE_CELL": cell}
    qsub = Path("/usr/bin/qsub")
    if not qsub.exists() or "gridengine" not in os.path.realpath(qsub):
        return None, f"Grid Engine is not installed (no SGE qsub at {qsub}): run {_UP} sge as root"
    try:
        spool = next(
            line.split()[1]
            for line in (root / cell / "common/bootstrap").read_text().splitlines()
            if line.startswith("qmaster_spool_dir")
        )
    except (OSError, StopIteration, IndexError):
        return None, f"Grid Engine cell {root / cell} was not set up: run {_UP} sge as root"
    if not _alive(f"{spool}/qmaster.pid", "sge_qmaster"):
        return None, f"sge_qmaster is not running: run {_UP} sge as root"
    if not _alive("/var/run/gridengine/execd.pid", "sge_execd"):
        return None, f"sge_execd is not running: run {_UP} sge as root"
    out = _run(["/usr/lib/gridengine/qstat", "-f", "-q", "all.q"], env=env)  # not the slow wrapper
    if out is None:
        return None, "qstat -f -q all.q failed: qmaster does not answer"
    # all.q@vm   BIP   0/0/8   0.22   lx-amd64   [states]
    rows = [line.split() for line in out.splitlines() if line.startswith("all.q@")]
    if not rows or len(rows[0]) < 5:
        return None, f"queue all.q has no host yet: {out.strip()[:200]!r}"
    row = rows[0]
    if len(row) > 5:
        return (
            None,
            f"queue {row[0]} is in state {row[5]!r} (u: execd not reporting, a: alarm, d: disabled)",
        )
    return SgeInfo(
        root=root,
        cell=cell,
        host=row[0].split("@", 1)[1],
        queue="all.q",
        slots=int(row[2].split("/")[-1]),
        pes=("smp", "mpi"),
        qsub=qsub,
        accounting_file=root / cell / "common/accounting",
        env=env,
    ), ""


def sge() -> SgeInfo | None:
    """The running Grid Engine with a usable queue all.q, or None (see ``why_no_sge()``)."""
    return _probe_sge()[0]


def why_no_sge() -> str:
    """Why ``sge()`` is None; "" when qmaster, execd and queue all.q are up."""
    return _probe_sge()[1]


# ---------------------------------------------------------------- PBS/Torque wrappers over SLURM


TORQUE_BIN = Path(os.environ.get("ELSEWHERE_CI_TORQUE_DIR", "/opt/elsewhere-ci/torque")) / "bin"


@dataclass(frozen=True)
class TorqueInfo:
    """Debian's PBS/Torque command wrappers (qsub, qstat, qdel, ...) over the real SLURM.

    They live in ``bin_dir`` only (SGE owns /usr/bin/qsub): run them by full path or with
    ``env`` (PATH with ``bin_dir`` first). A job script needs a ``#!`` first line.
    """

    bin_dir: Path
    slurm: SlurmInfo
    env: dict[str, str] = field(default_factory=dict)


def _probe_torque() -> tuple[TorqueInfo | None, str]:
    if not (TORQUE_BIN / "qsub").is_file():
        return None, f"the PBS wrappers are not unpacked in {TORQUE_BIN}: run {_UP} torque as root"
    if not Path("/usr/lib/x86_64-linux-gnu/perl5/5.36/Slurm.pm").exists():
        return (
            None,
            f"the PBS wrappers need Perl's Slurm module (libslurm-perl): run {_UP} torque as root",
        )
    info, why = _probe_slurm()
    if info is None:
        return None, f"the PBS wrappers drive SLURM, and {why}"
    path = f"{TORQUE_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
    return TorqueInfo(bin_dir=TORQUE_BIN, slurm=info, env={**info.env, "PATH": path}), ""


def torque() -> TorqueInfo | None:
    """The PBS/Torque wrappers with a running SLURM behind them, or None (see ``why_no_torque()``)."""
    return _probe_torque()[0]


def why_no_torque() -> str:
    """Why ``torque()`` is None; "" when the wrappers and SLURM are there."""
    return _probe_torque()[1]


# ---------------------------------------------------------------- MPI


@dataclass(frozen=True)
class MpiInfo:
    """Open MPI's ``mpiexec`` and whether mpi4py imports in this interpreter (the venv's).

    As root, mpiexec needs ``--allow-run-as-root``; more ranks than cores need
    ``--oversubscribe``: both are in ``mpiexec_args``, and ``env`` says the same by variables
    (for a process that calls mpiexec itself). Under SLURM use ``srun --mpi=pmix`` instead.
    """

    mpiexec: Path
    mpi4py: bool
    python: Path
    mpiexec_args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def command(self, n: int, *argv: str) -> list[str]:
        """``mpiexec`` with the needed flags, ``n`` ranks, then ``argv``."""
        return [str(self.mpiexec), *self.mpiexec_args, "-n", str(n), *argv]


def _probe_mpi() -> tuple[MpiInfo | None, str]:
    exe = shutil.which("mpiexec")
    if exe is None:
        return None, f"no mpiexec on PATH (Open MPI: openmpi-bin): run {_UP} mpi as root"
    root = os.geteuid() == 0
    args = ("--allow-run-as-root", "--oversubscribe") if root else ("--oversubscribe",)
    env = {"OMPI_MCA_rmaps_base_oversubscribe": "1"}
    if root:
        env |= {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return MpiInfo(
        mpiexec=Path(exe),
        mpi4py=importlib.util.find_spec("mpi4py") is not None,
        python=Path(sys.executable),
        mpiexec_args=args,
        env=env,
    ), ""


def mpi() -> MpiInfo | None:
    """Open MPI's mpiexec (and whether mpi4py is importable), or None (see ``why_no_mpi()``)."""
    return _probe_mpi()[0]


def why_no_mpi() -> str:
    """Why ``mpi()`` is None; "" when mpiexec is on PATH."""
    return _probe_mpi()[1]


def why_no_mpi4py() -> str:
    """Why MPI jobs in Python cannot run here (no mpiexec, or no mpi4py); "" when both are there."""
    info, why = _probe_mpi()
    if info is None:
        return why
    if not info.mpi4py:
        return f"mpi4py is not installed in {sys.prefix}: run {_UP} mpi (or pip install mpi4py)"
    return ""


# ---------------------------------------------------------------- network namespaces


@dataclass(frozen=True)
class NetnsHost:
    """One test host: network namespace ``name`` with ``address`` on its eth0."""

    name: str
    address: str

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's namespace (needs root)."""
        return ["ip", "netns", "exec", self.name, *argv]


@dataclass(frozen=True)
class NetnsInfo:
    """The test hosts of ``ci/services/netns.sh``: ew-h1..ew-hN at 10.77.0.1..N/24.

    The bridge joining them lives in namespace ``bridge``; multicast flows between the hosts.
    Nothing in the root namespace can reach ``subnet``: never send to it from there.
    """

    hosts: tuple[NetnsHost, ...]
    bridge: str = "ew-br"
    subnet: str = "10.77.0.0/24"


def _probe_netns() -> tuple[NetnsInfo | None, str]:
    if os.geteuid() != 0:
        return None, "network namespaces need root (ip netns exec)"
    run = Path("/run/netns")
    names = sorted(
        (p.name for p in run.glob("ew-h*") if p.name[4:].isdigit()), key=lambda n: int(n[4:])
    )
    if not (run / "ew-br").exists() or len(names) < 2:
        return None, f"no test hosts ew-h1.. in network namespaces: run {_UP} netns as root"
    hosts = []
    for name in names:
        out = _run(["ip", "-n", name, "-4", "-o", "addr", "show", "dev", "eth0"], timeout_s=1.0)
        addr = out.split()[3].split("/")[0] if out and len(out.split()) > 3 else None
        if addr is None:
            return (
                None,
                f"namespace {name} has no IPv4 address on eth0: run ci/services/netns-down.sh, then {_UP} netns",
            )
        hosts.append(NetnsHost(name=name, address=addr))
    return NetnsInfo(hosts=tuple(hosts)), ""


def netns() -> NetnsInfo | None:
    """The test hosts in network namespaces, or None (see ``why_no_netns()``)."""
    return _probe_netns()[0]


def why_no_netns() -> str:
    """Why ``netns()`` is None; "" when at least two hosts and the bridge are there."""
    return _probe_netns()[1]


# ---------------------------------------------------------------- sshd on 127.0.0.1


@dataclass(frozen=True)
class SshInfo:
    """The private sshd of ``ci/services/sshd.sh``: ``ssh -F config host`` logs in as root."""

    config: Path
    host: str
    port: int
    directory: Path


def _probe_ssh() -> tuple[SshInfo | None, str]:
    directory = Path(os.environ.get("ELSEWHERE_CI_SSH_DIR", "/var/lib/elsewhere-ci/ssh"))
    try:
        pairs = (
            line.split("=", 1)
            for line in (directory / "env").read_text().splitlines()
            if "=" in line
        )
        env = {k.strip(): v.strip() for k, v in pairs}
    except OSError:
        return None, f"sshd was never set up ({directory / 'env'} missing): run {_UP} sshd as root"
    if shutil.which("ssh") is None:
        return None, "no ssh client on PATH"
    if not _alive(directory / "sshd.pid", "sshd"):
        return None, f"the test sshd is not running: run {_UP} sshd as root"
    port = int(env.get("ELSEWHERE_CI_SSH_PORT", "2222"))
    if not _port_open(port):
        return None, f"the test sshd does not accept connections on 127.0.0.1:{port}"
    return SshInfo(
        config=Path(env.get("ELSEWHERE_CI_SSH_CONFIG", str(directory / "ssh_config"))),
        host=env.get("ELSEWHERE_CI_SSH_HOST", "ci"),
        port=port,
        directory=directory,
    ), ""


def ssh() -> SshInfo | None:
    """The running test sshd on 127.0.0.1, or None (see ``why_no_ssh()``)."""
    return _probe_ssh()[0]


def why_no_ssh() -> str:
    """Why ``ssh()`` is None; "" when the test sshd runs."""
    return _probe_ssh()[1]


# ---------------------------------------------------------------- a browser
CHROMIUM = "/usr/bin/chromium"  # Debian's (ci/services/chromium.sh)


def _probe_browser() -> tuple[str | None, str]:
    if importlib.util.find_spec("playwright") is None:
        return None, "playwright is not installed (scripts/test installs it with the test extras)"
    if not os.access(CHROMIUM, os.X_OK):
        return None, f"no {CHROMIUM}: {_UP} chromium installs Debian's chromium"
    return CHROMIUM, ""


def browser() -> str | None:
    """The Chromium that Playwright drives here (its path), or None (see ``why_no_browser()``)."""
    return _probe_browser()[0]


def why_no_browser() -> str:
    """Why ``browser()`` is None; "" when Chromium and Playwright are both there."""
    return _probe_browser()[1]
