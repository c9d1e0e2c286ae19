"""Communicating jobs with real Open MPI: locally with mpiexec, on the real SLURM with srun."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

import elsewhere as ew

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import services

pytestmark = [pytest.mark.timeout(180), pytest.mark.filterwarnings("ignore:.*oversubscribed")]


@pytest.fixture
def mpi_ok():
    if services.mpi() is None:
        pytest.skip(services.why_no_mpi())
    why = services.why_no_mpi4py()
    if why:
        pytest.skip(why)


def ring(n):
    t = ew.task()
    print(f"rank {t.rank} of {t.size}", flush=True)
    comm = t.comm
    right, left = (t.rank + 1) % t.size, (t.rank - 1) % t.size
    got = comm.sendrecv(t.rank * 10 + n, dest=right, source=left)
    return (t.rank, t.size, got, comm.allreduce(t.rank))


def fails_on_rank_one(_):
    t = ew.task()
    if t.rank == 1:
        raise ValueError("rank 1 gives up")
    t.comm.barrier()  # the others would wait here forever without an abort
    return t.rank


def sleeps(_):
    print(f"rank {ew.task().rank} pid {os.getpid()}", flush=True)
    time.sleep(120)


def _expected(size, n=5):
    return [(r, size, ((r - 1) % size) * 10 + n, size * (size - 1) // 2) for r in range(size)]


@pytest.mark.parametrize("ranks", [2, 4])
def test_local_ring_and_allreduce(ew_home, mpi_ok, ranks):
    job = ew.submit_communicating(ring, args=(5,), ranks=ranks)
    job.wait(timeout=90)
    assert job.results() == _expected(ranks)
    assert all(f"rank {r} of {ranks}" in job.log(r) for r in range(ranks))  # a log per rank


def test_local_failing_rank_fails_the_job_promptly(ew_home, mpi_ok):
    t0 = time.monotonic()
    job = ew.submit_communicating(fails_on_rank_one, args=(0,), ranks=3)
    job.wait(timeout=90)
    assert time.monotonic() - t0 < 60
    res = job.results()
    assert isinstance(res[1], ew.TaskError) and res[1].type_name == "ValueError"
    assert "rank 1" in str(res[1])
    assert job.check().state is ew.JobState.FAILED


def _rank_pids(job):
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read()
            except OSError:
                continue
            if str(job.path).encode() in cmd and b"--mpi" in cmd:
                pids.append(int(d))
    return pids


def test_local_cancel_stops_every_rank(ew_home, mpi_ok):
    job = ew.submit_communicating(sleeps, args=(0,), ranks=2)
    deadline = time.monotonic() + 60
    while len([p for p in _rank_pids(job) if b"python" in open(f"/proc/{p}/cmdline", "rb").read()]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    job.cancel()
    deadline = time.monotonic() + 20
    while _rank_pids(job):
        assert time.monotonic() < deadline, _rank_pids(job)
        time.sleep(0.1)
    assert job.check().state is ew.JobState.CANCELLED


def test_recover_communicating_job(ew_home, mpi_ok):
    job = ew.submit_communicating(ring, args=(1,), ranks=2, name="mpi-rec")
    again = ew.recover("mpi-rec")
    again.wait(timeout=90)
    assert again.id == job.id and again.results() == _expected(2, 1)


def test_missing_launcher_says_what_to_install(ew_home):
    with pytest.raises(ew.ConfigError, match="install"):
        ew.submit_communicating(ring, args=(1,), ranks=2,
                                on=ew.local(additional_properties={"mpi_launcher": "no-such-mpiexec"}))
    assert ew.jobs() == []


@pytest.fixture
def slurm_mpi():
    info = services.slurm()
    if info is None:
        pytest.skip(services.why_no_slurm())
    if not info.pmix:
        pytest.skip("SLURM runs without the pmix plugin (install openmpi-bin before slurmd starts)")
    if services.why_no_mpi4py():
        pytest.skip(services.why_no_mpi4py())


def test_slurm_ring_and_failing_rank(ew_home, slurm_mpi):
    cl = ew.slurm(partition="debug", status_interval_s=0.5)
    job = ew.submit_communicating(ring, args=(5,), ranks=4, on=cl)
    job.wait(timeout=120)
    assert job.results() == _expected(4)
    assert "srun --mpi=pmix" in cl.job_script(job)
    t0 = time.monotonic()
    bad = ew.submit_communicating(fails_on_rank_one, args=(0,), ranks=3, on=cl)
    bad.wait(timeout=120)
    assert time.monotonic() - t0 < 60  # seconds, not the walltime
    res = bad.results()
    assert res[1].type_name == "ValueError" and "rank 1" in str(res[1])
    assert bad.check().state is ew.JobState.FAILED


def test_too_many_ranks_on_slurm_is_a_clear_error(ew_home, slurm_mpi):
    job = ew.submit_communicating(ring, args=(1,), ranks=64, on=ew.slurm(partition="debug", status_interval_s=0.5))
    job.wait(timeout=60)  # fails at once instead of pending forever
    err = job.results()[0]
    assert isinstance(err, ew.TaskError) and "can never start" in err.message
    assert "PartitionConfig" in err.message or "Limit" in err.message


def test_sge_parallel_environment(ew_home):
    if services.sge() is None:
        pytest.skip(services.why_no_sge())
    if services.why_no_mpi4py():
        pytest.skip(services.why_no_mpi4py())
    cl = ew.batch("sge", status_interval_s=0.5)
    job = ew.submit_communicating(ring, args=(5,), ranks=2, on=cl)
    job.wait(timeout=120)
    assert job.results() == _expected(2)
    assert "-pe mpi 2" in cl.job_script(job)


def test_ssh_node_mpiexec(ew_home, mpi_ok, tmp_path):
    info = services.ssh()
    if info is None:
        pytest.skip(services.why_no_ssh())
    cl = ew.ssh({info.host: 2}, ssh_config=str(info.config), python=sys.executable,
                remote_storage=str(tmp_path / "remote"))
    job = ew.submit_communicating(ring, args=(5,), ranks=2, on=cl)
    job.wait(timeout=120)
    assert job.results() == _expected(2)
    bad = ew.submit_communicating(fails_on_rank_one, args=(0,), ranks=2, on=cl)
    bad.wait(timeout=120)
    assert bad.results()[1].type_name == "ValueError" and bad.check().state is ew.JobState.FAILED


CROSS_HOST = """
import json, os, sys
import elsewhere as ew

def where(_):
    t = ew.task()
    return [t.rank, t.size, t.comm.allreduce(t.rank), os.readlink("/proc/self/ns/net")]

cfg = sys.argv[1]
cl = ew.ssh({"h2": 1, "h3": 1}, ssh_config=cfg, python=sys.executable, remote_storage=sys.argv[2],
            additional_properties={"mpi_host_names": "destinations",
                                   "mpi_args": ["--mca", "plm_rsh_agent", "ssh -F " + cfg]})
job = ew.submit_communicating(where, args=(0,), ranks=2, on=cl)
job.wait(timeout=120, progress=False)
print("RESULT", json.dumps(job.results()))
"""


def test_ranks_on_two_ssh_hosts_in_their_own_network_namespaces(ew_home, mpi_ok, tmp_path):
    import subprocess

    from netns_ssh import netns_ssh, why_no_netns_ssh

    info = netns_ssh()
    if info is None:
        pytest.skip(why_no_netns_ssh())
    script = tmp_path / "client.py"
    script.write_text(CROSS_HOST)
    # the client runs inside ew-h1: nothing is sent to the namespaces' subnet from here
    out = subprocess.run(["ip", "netns", "exec", "ew-h1", sys.executable, str(script), str(info.config),
                          str(tmp_path / "remote")], capture_output=True, text=True, timeout=150,
                         env=dict(os.environ))
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, out.stderr[-2000:]
    import json

    res = json.loads(line[len("RESULT "):])
    assert [r[:3] for r in res] == [[0, 2, 1], [1, 2, 1]]  # they talked
    assert res[0][3] != res[1][3]  # each rank in its own host's network namespace
