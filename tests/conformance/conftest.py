"""The backends of the conformance suite: every behaviour of test_contract.py runs on each.

The ``backend`` fixture is parametrised over :data:`BACKENDS`; each value is a
:class:`~conformance.contract.Backend`, a cluster factory (``backend()`` makes the cluster)
that also knows its call as source for other processes. A backend whose service is missing
skips with the reason ``tests/services.py`` gives. A new backend is one more entry here,
and it inherits the whole contract.

======== ====================================================================================
local    ``ew.local(cores=2)``
ssh      ``ew.ssh`` on the loopback sshd of ci/services/sshd.sh, remote storage of its own
slurm    ``ew.slurm`` on the real single-node SLURM
sge      ``ew.batch("sge")`` on the real Grid Engine
pbs      ``ew.batch("slurm-torque")``: Debian's PBS wrappers (qsub, qstat, qdel) over SLURM
lsf      ``ew.batch("lsf")`` on the stateful fake of tests/fakes (it runs the scripts)
htcondor ``ew.batch("htcondor")``, the same
flux     ``ew.batch("flux")``, the same
peers    ``ew.peers`` with a group key, on real worker daemons on loopback (one set a module)
nohup    the user plugin ``examples/nohup_scheduler.py:NohupCluster`` by module path
tsp      the user plugin ``examples/tsp_scheduler.py:TspCluster`` on a real Task Spooler server
         of its own (ci/services/tsp.sh installs it)
======== ====================================================================================
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import services
from batch import tsp_server
from conformance.contract import Backend
from elsewhere.peer.keys import write_key
from fakes.conftest import make_fake
from peer.peer_procs import Workers, free_port

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests" / "fakes"
BACKENDS = (
    "local",
    "ssh",
    "slurm",
    "sge",
    "pbs",
    "lsf",
    "htcondor",
    "flux",
    "peers",
    "nohup",
    "tsp",
)
STATUS_INTERVAL_S = 0.5  # batch schedulers: a status command at most this often


@pytest.fixture(scope="module")
def peer_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """Two peer worker daemons (one slot each) on loopback with a fresh group key, shared by
    the tests of a module: (key file, discovery port)."""
    tmp = tmp_path_factory.mktemp("peer-lab")
    key = write_key("lab", tmp / "lab.key")
    port = free_port()
    with Workers(tmp, 2, port=port, key=key):
        yield key, port


def _local(request: pytest.FixtureRequest) -> Backend:
    return Backend("local", "local", kwargs={"cores": 2})


def _ssh(request: pytest.FixtureRequest) -> Backend:
    info = services.ssh()
    if info is None:
        pytest.skip(services.why_no_ssh())
    remote = request.getfixturevalue("tmp_path") / "remote-storage"  # not the local storage
    return Backend("ssh", "ssh", ({info.host: 2},),
                   {"ssh_config": str(info.config), "python": sys.executable,
                    "remote_storage": str(remote)}, remote=remote)  # fmt: skip


def _slurm(request: pytest.FixtureRequest) -> Backend:
    info = services.slurm()
    if info is None:
        pytest.skip(services.why_no_slurm())
    monkeypatch = request.getfixturevalue("monkeypatch")
    for key, value in info.env.items():
        monkeypatch.setenv(key, value)
    return Backend("slurm", "slurm", kwargs={"partition": info.default_partition,
                                             "status_interval_s": STATUS_INTERVAL_S})  # fmt: skip


def _sge(request: pytest.FixtureRequest) -> Backend:
    info = services.sge()
    if info is None:
        pytest.skip(services.why_no_sge())
    monkeypatch = request.getfixturevalue("monkeypatch")
    for key, value in info.env.items():
        monkeypatch.setenv(key, value)
    return Backend("sge", "batch", ("sge",), {"status_interval_s": STATUS_INTERVAL_S})


def _pbs(request: pytest.FixtureRequest) -> Backend:
    info = services.torque()
    if info is None:
        pytest.skip(services.why_no_torque())
    monkeypatch = request.getfixturevalue("monkeypatch")
    for key, value in info.env.items():  # the wrappers first on PATH
        monkeypatch.setenv(key, value)
    return Backend("pbs", "batch", ("slurm-torque",), {"status_interval_s": STATUS_INTERVAL_S})


def _fake(name: str):
    def make(request: pytest.FixtureRequest) -> Backend:
        if not (FAKES / name / "bin").is_dir():
            pytest.skip(f"no fake {name} commands in {FAKES / name / 'bin'}")
        folder = request.getfixturevalue("tmp_path") / f"fake-{name}"
        folder.mkdir()
        fake = make_fake(name, folder, request.getfixturevalue("monkeypatch"))
        # after the jobs are cancelled: whatever still runs (kill_all takes its time, even
        # when nothing does)
        request.addfinalizer(lambda: fake.running_pids() and fake.kill_all())
        return Backend(name, "batch", (name,), {"status_interval_s": STATUS_INTERVAL_S})

    return make


def _peers(request: pytest.FixtureRequest) -> Backend:
    key, port = request.getfixturevalue("peer_lab")
    return Backend(
        "peers", "peers", ("lab",), {"key": str(key), "port": port, "interface": "127.0.0.1"}
    )


def _examples_importable(request: pytest.FixtureRequest) -> pytest.MonkeyPatch:
    """examples/ importable here and in the processes a test starts (workers, a new client)."""
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.syspath_prepend(str(REPO))
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(REPO) + (os.pathsep + old if old else ""))
    return monkeypatch


def _nohup(request: pytest.FixtureRequest) -> Backend:
    _examples_importable(request)
    return Backend("nohup", "batch", ("examples.nohup_scheduler:NohupCluster",), {"slots": 2})


def _tsp(request: pytest.FixtureRequest) -> Backend:
    monkeypatch = _examples_importable(request)
    server = tsp_server.start(request.getfixturevalue("tmp_path"), monkeypatch)
    request.addfinalizer(server.stop)  # after the jobs are cancelled
    return Backend("tsp", "batch", ("examples.tsp_scheduler:TspCluster",), {"slots": 2})


_MAKERS = {
    "local": _local, "ssh": _ssh, "slurm": _slurm, "sge": _sge, "pbs": _pbs,
    "lsf": _fake("lsf"), "htcondor": _fake("htcondor"), "flux": _fake("flux"),
    "peers": _peers, "nohup": _nohup, "tsp": _tsp,
}  # fmt: skip


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, ew_home: Path) -> Iterator[Backend]:
    """Each backend in turn, as a cluster factory, in a private elsewhere home; afterwards
    every job of that home that has not ended is cancelled (nothing left running on a
    shared scheduler or on the shared peer workers)."""
    b = _MAKERS[request.param](request)
    yield b
    b.cancel_unfinished()
    b.close()
