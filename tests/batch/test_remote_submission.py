"""Remote submission for any backend (RemoteCluster): commands on a login node over ssh, the
job folder in a remote storage that shares nothing with this machine, mirrored both ways.

The login node is the loopback sshd (ci/services/sshd.sh); the "remote" storage is a folder
this machine's client never reads directly: everything it learns comes back through the
mirror. Tried with the real SLURM behind it, and with a user's plugin built on RemoteCluster.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

import elsewhere as ew

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import services

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def sshd():
    info = services.ssh()
    if info is None:
        pytest.skip(services.why_no_ssh())
    return info


def where(x):
    import os

    print(f"task {x} in {os.getcwd()}")
    return x * 10


class Background(ew.RemoteCluster):
    """A user's plugin on RemoteCluster: each job's tasks in one background process on the
    host, started over ssh on the job folder's copy there."""

    kind = "background"

    def submit_independent(self, job: ew.JobHandle) -> None:
        self.mirror_up(job)
        spec = ",".join(map(str, job.tasks))
        cmd = " ".join(shlex.quote(w) for w in
                       [sys.executable, "-m", "elsewhere.worker", "--job", self.worker_dir(job), "--tasks", spec])
        self.run_command(["sh", "-c", f"nohup {cmd} >/dev/null 2>&1 &"])

    def poll(self, job: ew.JobHandle) -> None:
        self.mirror_down(job)

    def delete_job(self, job: ew.JobHandle) -> None:
        self.discard_copy(job)


def test_a_plugin_on_remote_cluster_runs_in_the_remote_copy(ew_home, sshd, tmp_path):
    remote = tmp_path / "remote"
    cl = Background(host=sshd.host, ssh_config=str(sshd.config), remote_storage=str(remote))
    assert not cl.shares_filesystem()
    job = ew.submit(where, range(4), on=cl, name="bg-remote")
    job.wait(timeout=60)
    assert job.results() == [0, 10, 20, 30]
    assert f"in {remote / job.id}" in job.log(2)  # it ran in the copy, and its log came back
    assert (remote / job.id / "journal").is_dir()
    assert ew.recover("bg-remote").results() == [0, 10, 20, 30]  # rebuilt from its settings
    job.purge()
    assert not (remote / job.id).exists() and not job.path.exists()


def test_remote_cluster_checks_its_settings():
    with pytest.raises(ew.ConfigError, match="remote_storage= needs host="):
        Background(remote_storage="/scratch/me")
    with pytest.raises(ew.ConfigError, match="ssh_options must be a list"):
        Background(host="login", ssh_options="-p 22")
    cl = Background(host="login", remote_storage="/scratch/me", ssh_options=["-p", "2222"])
    assert cl.settings()["remote_storage"] == "/scratch/me" and cl.settings()["ssh_options"] == ["-p", "2222"]


def test_slurm_through_a_login_node_without_a_shared_file_system(ew_home, sshd, tmp_path):
    if services.slurm() is None:
        pytest.skip(services.why_no_slurm())
    remote = tmp_path / "scratch"
    cl = ew.slurm(partition="debug", host=sshd.host, ssh_config=str(sshd.config), remote_storage=str(remote),
                  python=sys.executable, status_interval_s=0.5)
    job = ew.submit(where, range(3), on=cl)
    job.wait(timeout=120)
    assert job.results() == [0, 10, 20], job.check()
    assert f"in {remote / job.id}" in job.log(0) or str(remote / job.id) in job.log(0)
    assert (remote / job.id / "submissions" / "0.sh").exists()  # the script went up, sbatch ran there
    job.purge()
    assert not (remote / job.id).exists()
