"""ssh nodes: the job folder goes to a node on the agent's own session, streamed while written."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import elsewhere as ew

pytestmark = pytest.mark.timeout(180)
PY = sys.executable  # the remote side is this machine: the same venv has elsewhere


def nodes(sshd, remote, **kw):
    return ew.ssh({sshd.host: 2}, ssh_config=str(sshd.config), python=PY, remote_storage=str(remote), **kw)


def total(a):
    return float(a.sum()), a.shape


class Unpicklable:
    def __reduce__(self):
        time.sleep(1.5)  # by now the node was asked and the payload's first chunk went
        raise TypeError("this one does not travel")


def test_the_node_copy_is_the_job_folder_and_one_session_carries_everything(ew_home, sshd, tmp_path):
    remote = tmp_path / "remote"
    data = tmp_path / "input.txt"
    data.write_text("read me there")
    arrays = [np.random.default_rng(i).random(300_000 + i) for i in range(3)]  # a few MB
    cl = nodes(sshd, remote)
    job = ew.submit(total, arrays, on=cl, files=[data], name="copy-check")
    job.wait(timeout=120, progress=False)
    assert [r[1] for r in job.results()] == [a.shape for a in arrays]
    assert [r[0] for r in job.results()] == pytest.approx([float(a.sum()) for a in arrays])
    copy = remote / job.id
    # the payload arrived byte for byte, with its time and mode, and so did the user's file
    for rel in ("payload.log", "job.json", "files/input.txt"):
        here, there = job.path / rel, copy / rel
        assert there.read_bytes() == here.read_bytes(), rel
        assert int(there.stat().st_mtime) == int(here.stat().st_mtime), rel
        assert there.stat().st_mode & 0o777 == here.stat().st_mode & 0o777, rel
    # probe, copy, start and every poll: one agent session, one login
    assert cl.session(sshd.host).opened == 1
    assert cl.transport(sshd.host).connections_opened <= 1
    job.purge()
    assert not copy.exists()


def test_inputs_that_cannot_be_written_leave_no_copy_on_the_node(ew_home, sshd, tmp_path):
    remote = tmp_path / "remote"
    big = np.random.default_rng(0).random(1_000_000)  # the stream has begun when the second fails
    with pytest.raises(ew.SerializationError):
        ew.submit(total, [big, Unpicklable()], on=nodes(sshd, remote), name="never")
    # the thread that streamed the payload there notices and removes the copy
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(t.name == "elsewhere-ssh-prepare" for t in threading.enumerate()):
        time.sleep(0.05)
    assert not any(t.name == "elsewhere-ssh-prepare" for t in threading.enumerate())
    assert remote.is_dir(), "the node was never asked"
    assert list(remote.iterdir()) == []
    assert ew.jobs() == []


def test_python_without_elsewhere_on_the_node_says_what_to_install(ew_home, sshd, tmp_path):
    bare = "/usr/bin/python3"
    if not os.path.exists(bare) or subprocess.run([bare, "-c", "import elsewhere"],
                                                  capture_output=True).returncode == 0:
        pytest.skip(f"no {bare} without elsewhere on this machine")
    cl = ew.ssh([sshd.host], ssh_config=str(sshd.config), python=bare, remote_storage=str(tmp_path))
    with pytest.raises(ew.TransportError) as info:
        ew.submit(abs, [1], on=cl)
    assert "elsewhere is not installed" in str(info.value) and sshd.host in str(info.value)
    assert ew.jobs() == []


def test_two_jobs_submitted_at_once_on_one_cluster_each_get_their_own_copy(ew_home, sshd, tmp_path):
    remote = tmp_path / "remote"
    cl = nodes(sshd, remote)
    inputs = {name: [np.full(200_000, i, dtype=float) for i in range(k)] for name, k in (("a", 2), ("b", 3))}
    jobs: dict[str, ew.Job] = {}
    errors: list[BaseException] = []

    def submit(name: str) -> None:
        try:
            # np.sum travels by reference: serial.by_value_for is not safe from two threads yet
            jobs[name] = ew.submit(np.sum, inputs[name], on=cl, name=f"at-once-{name}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(n,)) for n in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for name, job in jobs.items():
        job.wait(timeout=120, progress=False)
        assert job.results() == [200_000.0 * i for i in range(len(inputs[name]))]
        assert (remote / job.id / "payload.log").read_bytes() == (job.path / "payload.log").read_bytes()
    # no thread is left streaming a payload nobody will finish
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(t.name == "elsewhere-ssh-prepare" for t in threading.enumerate()):
        time.sleep(0.05)
    assert not any(t.name == "elsewhere-ssh-prepare" for t in threading.enumerate())
    assert cl._early == {}
