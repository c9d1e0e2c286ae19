"""ssh nodes against a real sshd on loopback (ci/services/sshd.sh), key authentication."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import elsewhere as ew

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import services

pytestmark = pytest.mark.timeout(180)
PY = sys.executable  # the remote side is this machine: the same venv has elsewhere


@pytest.fixture
def remote(tmp_path):
    d = tmp_path / "remote-storage"  # a different folder from the local storage
    return d


def nodes(sshd, remote, cores=2, **kw):
    return ew.ssh({sshd.host: cores}, ssh_config=str(sshd.config), python=PY,
                  remote_storage=str(remote), **kw)


def where(x):
    with open(f"written-{x}.txt", "w") as f:
        f.write(str(x))
    print(f"task {x} in {os.getcwd()}")
    return x * x, os.getcwd()


def test_job_runs_in_remote_copy_not_local_folder(ew_home, sshd, remote):
    cl = nodes(sshd, remote)
    job = ew.submit(where, range(5), on=cl, name="remote-copy")
    job.wait(timeout=120)
    res = job.results()
    assert [r[0] for r in res] == [x * x for x in range(5)]
    for _, cwd in res:  # tasks ran in the node's copy, never in a local path
        assert cwd.startswith(str(remote)) and not cwd.startswith(str(ew_home))
    assert "task 3 in" in job.log(3)
    assert (remote / job.id / "journal").is_dir()
    assert cl.transport(sshd.host).connections_opened <= 1  # one connection (or a kept one) for everything
    job.get(files=True)
    assert sorted(p.name for p in (job.path / "files").glob("written-*")) == [
        f"written-{i}.txt" for i in range(5)]
    job.purge(local=False)  # remote copy goes, the local folder stays
    assert not (remote / job.id).exists() and job.path.exists()
    job.purge()
    assert not job.path.exists()


def test_quoting_nothing_runs_that_should_not(ew_home, sshd, remote, tmp_path):
    marker = tmp_path / "pwned"
    evil = f"x'; touch {marker}; echo '$(touch {marker})`touch {marker}`"
    # setup= is the user's own shell code; quoted properly, the evil text stays text
    cl = nodes(sshd, remote, setup=f"echo setting up; echo {shlex.quote(evil)} > setup-note.txt")
    job = ew.submit(lambda s: s, [evil, "a b\nc"], on=cl, name=f"name with spaces; $(touch {marker})")
    job.wait(timeout=120)
    assert job.results() == [evil, "a b\nc"]
    assert not marker.exists()
    assert (remote / job.id / "files" / "setup-note.txt").read_text().strip() == evil
    assert "setting up" in (job.path / "logs").joinpath(
        next(p.name for p in (job.path / "logs").glob("setup-*.log"))).read_text()


def test_failing_setup_is_a_clear_error(ew_home, sshd, remote):
    with pytest.raises(ew.TransportError) as info:
        ew.submit(abs, [1], on=nodes(sshd, remote, setup="echo compiling; exit 3"))
    assert sshd.host in str(info.value) and "setup failed" in str(info.value)


def _pid_then_sleep(x):
    if x == 1:
        with open("pid", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)
    return x


def test_killed_worker_is_lost_others_kept(ew_home, sshd, remote):
    cl = nodes(sshd, remote)
    job = ew.submit(_pid_then_sleep, range(4), on=cl)
    pidfile = remote / job.id / "files" / "pid"
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    job.wait(timeout=120)
    res = job.results()
    assert res[1].reason == "lost" and [res[0], res[2], res[3]] == [0, 2, 3]


def test_client_killed_then_recover(ew_home, sshd, remote, tmp_path):
    code = (
        "import elsewhere as ew, time, sys\n"
        "def slow(x):\n    time.sleep(0.5)\n    return -x\n"
        f"ew.submit(slow, range(6), name='ssh-detached', on=ew.ssh({{{sshd.host!r}: 2}}, "
        f"ssh_config={str(sshd.config)!r}, python={PY!r}, remote_storage={str(remote)!r}))\n"
        "print('submitted', flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=dict(os.environ))
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"submitted"
    proc.kill()
    proc.wait(timeout=10)
    out = subprocess.run(
        [sys.executable, "-c", "import elsewhere as ew; j = ew.recover('ssh-detached'); "
         "j.wait(timeout=120, progress=False); print(j.results())"],
        capture_output=True, text=True, timeout=150, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([-x for x in range(6)])


def test_bad_hosts_are_clear_errors(ew_home, sshd, remote, tmp_path):
    # nothing listens on this port
    with pytest.raises(ew.TransportError) as info:
        ew.submit(abs, [1], on=ew.ssh(["127.0.0.1"], ssh_options=["Port=1", "BatchMode=yes"],
                                      python=PY, remote_storage=str(remote)))
    assert "127.0.0.1" in str(info.value)
    # a user the host does not accept
    with pytest.raises(ew.TransportError) as info:
        ew.submit(abs, [1], on=ew.ssh([f"nobody-here@{sshd.host}"], ssh_config=str(sshd.config),
                                      python=PY, remote_storage=str(remote)))
    assert "nobody-here" in str(info.value) or sshd.host in str(info.value)
    # a host key we do not know
    cfg = tmp_path / "cfg"
    cfg.write_text(sshd.config.read_text().replace(
        "UserKnownHostsFile", f"UserKnownHostsFile {tmp_path}/empty_known_hosts\n  #"))
    with pytest.raises(ew.TransportError) as info:
        ew.submit(abs, [1], on=ew.ssh([sshd.host], ssh_config=str(cfg), python=PY,
                                      remote_storage=str(remote)))
    assert "host key" in str(info.value).lower()
    # no such python there
    with pytest.raises(ew.TransportError) as info:
        ew.submit(abs, [1], on=ew.ssh([sshd.host], ssh_config=str(sshd.config),
                                      python="/no/such/python3", remote_storage=str(remote)))
    assert "/no/such/python3" in str(info.value) and sshd.host in str(info.value)
    assert ew.jobs() == []


@pytest.fixture
def slurm_info():
    info = services.slurm()
    if info is None:
        pytest.skip(services.why_no_slurm())
    return info


def test_remote_submission_to_slurm_without_shared_storage(ew_home, sshd, remote, slurm_info):
    cl = ew.slurm(host=sshd.host, ssh_config=str(sshd.config), remote_storage=str(remote), python=PY,
                  partition="debug", status_interval_s=0.5)
    job = ew.submit(where, range(4), on=cl, name="over-ssh")
    job.wait(timeout=120)
    res = job.results()
    assert [r[0] for r in res] == [0, 1, 4, 9]
    assert all(cwd.startswith(str(remote)) for _, cwd in res)
    # the workers wrote only into the remote copy; what we read was mirrored down
    assert (remote / job.id / "journal").is_dir() and list((job.path / "journal").glob("*.rec"))
    assert "task 2 in" in job.log(2)
    assert cl.transport.connections_opened <= 1
    job.purge()
    assert not (remote / job.id).exists()


def test_client_killed_inside_submit_the_next_poll_hands_the_job_over(ew_home, sshd, remote):
    """A client killed after it registered the job and before it handed it to the nodes (the
    payload perhaps half streamed there): ``ew.recover(name).wait()`` hands it over, or says why
    it cannot (here: the node's storage is not a folder) and does so once that is fixed."""
    code = (
        "import os, signal\nimport elsewhere as ew\nfrom elsewhere.backends.ssh import SSHCluster\n"
        "SSHCluster.submit_independent = lambda self, job: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"ew.submit(abs, [-1, -2, -3], name='ssh-orphan', on=ew.ssh({{{sshd.host!r}: 1}}, "
        f"ssh_config={str(sshd.config)!r}, python={PY!r}, remote_storage={str(remote)!r}))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    job = ew.recover("ssh-orphan")
    assert not job.handle.store.queue().submitted
    aside = remote.with_name("remote-aside")
    streamed = remote.exists()  # (the client may have died before its first look at the node)
    if streamed:
        remote.rename(aside)
    remote.write_text("not a folder")
    with pytest.raises(ew.JobError, match=r"'ssh-orphan' was registered by a client .* that ended before it "
                       r"handed the job to its ssh cluster; handing it over now failed .*cannot write to"):
        job.wait(timeout=60)
    remote.unlink()
    if streamed:
        aside.rename(remote)
    job.wait(timeout=120)
    assert job.results() == [1, 2, 3]
    assert (remote / job.id / "journal").is_dir()


def _megabyte(i):
    return bytes([i]) * (1 << 20)


@pytest.fixture
def small_remote(remote):
    """The nodes' storage on a 4 MB tmpfs (mounted here, as root), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    remote.mkdir()
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(remote)],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
    yield remote
    subprocess.run(["umount", "-l", str(remote)], capture_output=True, timeout=30)


def test_a_job_halted_on_a_node_says_why_on_the_client(ew_home, sshd, small_remote):
    """The node's disk fills up: its worker halts the job there, and every task that did not
    finish fails on the client with the node's reason; with room again, a retry runs them."""
    job = ew.submit(_megabyte, range(8), on=nodes(sshd, small_remote, cores=1), name="node-full")
    job.wait(timeout=120)
    res = job.results()
    full = [i for i, v in enumerate(res) if isinstance(v, ew.TaskError)]
    assert full, "the node's disk did not fill up"
    for i in full:
        assert res[i].reason == "lost" and "no space left on" in res[i].message, (i, res[i].message)
        assert str(small_remote) in res[i].message  # the node's folder, as the node said it
    assert all(res[i] == _megabyte(i) for i in range(8) if i not in full)
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_remote)], check=True, timeout=30)
    job.retry()
    job.wait(timeout=120)
    assert job.results() == [_megabyte(i) for i in range(8)]
