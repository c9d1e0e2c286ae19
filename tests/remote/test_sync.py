"""A job folder and its copy on a host (JobCopy): up, back, and away, on every way files move."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from elsewhere.hosts import WORKER_OUTPUT, JobCopy, SSHTransport, Transport
from elsewhere.hosts.session import AgentSession
from elsewhere.util.errors import ConfigError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MakeSSH = Callable[..., SSHTransport]
PY = sys.executable  # the "remote" host is this machine: the same venv has elsewhere


def _job(root: Path) -> Path:
    """A job folder as a client makes it."""
    (root / "files").mkdir(parents=True)
    (root / "job.json").write_text('{"name": "j"}')
    (root / "payload.log").write_bytes(os.urandom(100_000))
    (root / "files" / "input.csv").write_text("a,b\n1,2\n")
    return root


def _worker_writes(copy: Path) -> None:
    """What workers leave in the copy: journals, results, logs, worker files, task files."""
    for rel, data in {"journal/w1.rec": b"r" * 10, "results/w1.bin": b"x" * 5000,
                      "logs/w1.log": b"hello\n", "workers/w1.cur": b"0",
                      "files/out.txt": b"made by a task", "scratch/tmp.bin": b"not for us"}.items():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes(data)


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_push_pull_and_discard_on_every_way_files_move(file_transport: Transport, tmp_path: Path) -> None:
    local = _job(tmp_path / "here" / "job")
    remote = tmp_path / "there" / "not" / "yet" / "made" / "job"  # parents made by the push
    copy = JobCopy(file_transport, local, str(remote))
    assert copy.push() is None
    assert _files(remote) == _files(local)
    # a second push sends what changed, and deletes nothing there
    (local / "job.json").write_text('{"name": "j", "more": 1}')
    os.utime(local / "job.json", (2_000_000_000, 2_000_000_000))
    (remote / "extra.txt").write_text("kept")
    copy.push()
    assert (remote / "job.json").read_text() == '{"name": "j", "more": 1}'
    assert (remote / "extra.txt").read_text() == "kept"
    _worker_writes(remote)
    copy.pull()
    got = _files(local)
    for rel in ("journal/w1.rec", "results/w1.bin", "logs/w1.log", "workers/w1.cur"):
        assert got[rel] == (remote / rel).read_bytes()
    assert "files/out.txt" not in got and "scratch/tmp.bin" not in got  # only what workers write
    assert copy.pull_files() == local / "files"
    assert (local / "files" / "out.txt").read_bytes() == b"made by a task"
    assert (local / "files" / "input.csv").exists()  # nothing deleted here
    copy.discard()
    assert not remote.exists()
    copy.discard()  # already gone: fine


def test_worker_output_names_what_workers_write() -> None:
    assert set(WORKER_OUTPUT) == {"journal/[!_]*", "journal/_control.*.rec", "results/**", "logs/**", "workers/**",
                                  "damage.txt"}  # (this side's journal/_control.rec stays its own)


def test_over_an_agent_session_the_payload_streams_then_the_rest_follows(
        make_ssh: MakeSSH, tmp_path: Path) -> None:
    local = _job(tmp_path / "here")
    remote = tmp_path / "there"
    ssh = make_ssh(python=PY)
    sess = AgentSession(ssh, PY)
    copy = JobCopy(ssh, local, str(remote), session=sess)
    finished = threading.Event()
    finished.set()  # the payload is written already: it goes at once
    streamed = copy.push_growing("payload.log", finished, lambda: True)
    assert streamed == (local / "payload.log").stat().st_size
    sent = copy.push(sent={"payload.log": streamed})
    assert sent == sum(len(v) for k, v in _files(local).items() if k != "payload.log")
    sess.request("info")  # puts do not answer: an answer after them means they are done
    assert _files(remote) == _files(local)
    _worker_writes(remote)
    copy.pull()
    assert (local / "results" / "w1.bin").read_bytes() == b"x" * 5000
    assert ssh.connections_opened == 1 and sess.opened == 1  # one login for all of it
    copy.discard()
    assert not remote.exists()
    sess.close()


def test_streaming_needs_a_session_and_a_copy_needs_a_folder(tmp_path: Path) -> None:
    from elsewhere.hosts import LocalTransport

    copy = JobCopy(LocalTransport(), tmp_path, str(tmp_path / "copy"))
    with pytest.raises(ConfigError, match="agent session"):
        copy.push_growing("payload.log", threading.Event(), lambda: True)
    with pytest.raises(ConfigError, match="needs a folder"):
        JobCopy(LocalTransport(), tmp_path, "")
    assert "copy" in repr(copy)
