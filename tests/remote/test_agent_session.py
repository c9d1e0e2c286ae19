"""The agent session: one ``elsewhere.hosts.agent serve`` per host, requests over one ssh session.

Against the CI sshd (the "remote" host is this machine, so the tests look at the
copies directly), and ``agent serve`` fed by a pipe for the wire's edge cases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from elsewhere.hosts import SSHTransport
from elsewhere.hosts.agent import MARKER
from elsewhere.hosts.session import AgentSession
from elsewhere.hosts.transport import CommandTimeout
from elsewhere.util.errors import HostUnreachable, RemoteSetupError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MakeSSH = Callable[..., SSHTransport]
PY = sys.executable  # the remote side is this machine: the same venv has elsewhere


def _tree(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_dir():
            out[rel] = "dir"
        else:
            st = p.stat()
            out[rel] = (p.read_bytes(), st.st_mode & 0o777, int(st.st_mtime))
    return out


def test_every_request_of_a_session_is_a_message_on_one_ssh_session(make_ssh: MakeSSH, tmp_path: Path) -> None:
    ssh = make_ssh()
    sess = AgentSession(ssh, PY)
    answers = [sess.request("info", dir=str(tmp_path / "store")) for _ in range(20)]
    assert all(a["writable"] == str(tmp_path / "store") for a in answers)
    assert answers[0]["rsync"]  # the client learns it here and runs no `which rsync`
    assert sess.opened == 1 and ssh.connections_opened == 1
    # an op the agent knows but whose job is missing answers an error, and the session stays
    assert "no job folder" in sess.request("poll", job=str(tmp_path / "nothing"), workers=1)["error"]
    assert sess.request("info")["elsewhere_version"]
    assert sess.opened == 1
    sess.close()


def test_put_tree_mirrors_contents_modes_times_empty_folders_and_links(make_ssh: MakeSSH, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "files" / "deep" / "er").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "job.json").write_text('{"a": 1}')
    (src / "files" / "deep" / "er" / "data.bin").write_bytes(os.urandom(3 << 20))
    (src / "files" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(src / "files" / "run.sh", 0o750)
    os.utime(src / "job.json", (1_600_000_000, 1_600_000_000))
    (src / "files" / "link").symlink_to("deep/er/data.bin")
    (src / "files" / "zero").write_bytes(b"")
    dest = tmp_path / "remote copy; $(touch pwned)"  # a path the remote shell must never see
    sess = AgentSession(make_ssh(), PY)
    sent = sess.put_tree(src, str(dest))
    assert sent == sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and not p.is_symlink())
    sess.request("info")  # puts do not answer: an answered request after them means they are done
    assert _tree(dest) == _tree(src)
    assert not (Path.home() / "pwned").exists() and not Path("pwned").exists()
    sess.close()


def test_put_tree_sends_only_the_rest_of_a_file_already_begun(make_ssh: MakeSSH, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(1 << 20)
    (src / "payload.log").write_bytes(data)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "payload.log").write_bytes(data[:1000])  # what went before
    sess = AgentSession(make_ssh(), PY)
    assert sess.put_tree(src, str(dest), sent={"payload.log": 1000}) == len(data) - 1000
    sess.request("info")
    assert (dest / "payload.log").read_bytes() == data
    sess.close()


def test_a_growing_file_streams_while_it_is_written(make_ssh: MakeSSH, tmp_path: Path) -> None:
    local = tmp_path / "payload.log"
    local.write_bytes(b"")
    dest = tmp_path / "dest"
    finished = threading.Event()
    parts = [os.urandom(200_000) for _ in range(30)]
    seen_remote_growing = []

    def writer() -> None:
        with open(local, "ab") as f:
            for part in parts:
                f.write(part)
                f.flush()
                time.sleep(0.01)
                remote = dest / "payload.log"
                seen_remote_growing.append(remote.stat().st_size if remote.exists() else 0)
        finished.set()

    sess = AgentSession(make_ssh(), PY)
    sess.request("info")
    th = threading.Thread(target=writer)
    th.start()
    sent = sess.put_growing(str(dest), "payload.log", local, finished, lambda: True)
    th.join(timeout=60)
    assert sent == sum(map(len, parts))
    sess.request("info")
    assert (dest / "payload.log").read_bytes() == b"".join(parts)
    # it went while the writer was still writing, not all at the end
    assert any(0 < n < sent for n in seen_remote_growing), seen_remote_growing
    sess.close()


def test_a_growing_file_stops_when_its_writer_gives_up(make_ssh: MakeSSH, tmp_path: Path) -> None:
    local = tmp_path / "payload.log"
    local.write_bytes(b"x" * 1000)
    sess = AgentSession(make_ssh(), PY)
    gone = threading.Event()
    threading.Timer(0.3, gone.set).start()
    out = sess.put_growing(str(tmp_path / "dest"), "payload.log", local, threading.Event(),
                           lambda: not gone.is_set())
    assert out == -1
    sess.close()


def test_a_failed_put_is_reported_by_the_next_start(make_ssh: MakeSSH, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "job.json").write_text("{}")
    (dest / "blocker").write_text("a file where a folder is needed")
    src = tmp_path / "src"
    (src / "blocker").mkdir(parents=True)
    (src / "blocker" / "f").write_text("x")
    sess = AgentSession(make_ssh(), PY)
    sess.put_tree(src, str(dest))
    ans = sess.request("start", job=str(dest), workers=1, tasks="0:0")
    assert "incomplete" in ans["error"] and "blocker" in ans["error"]
    # the session goes on: the next request is answered
    assert sess.request("info")["elsewhere_version"]
    sess.close()


def test_no_answer_in_time_closes_the_session_and_the_next_request_opens_another(
        make_ssh: MakeSSH, tmp_path: Path) -> None:
    silent = tmp_path / "silent-python"
    silent.write_text("#!/bin/sh\nexec sleep 60\n")
    silent.chmod(0o755)
    sess = AgentSession(make_ssh(), str(silent))
    with pytest.raises(CommandTimeout) as info:
        sess.request("info", timeout_s=1)
    assert "did not answer 'info'" in str(info.value)
    assert sess._proc is None
    sess.python = PY
    sess.argv[0] = PY
    assert sess.request("info")["elsewhere_version"] and sess.opened == 2
    sess.close()


def test_an_idle_session_is_replaced_before_its_next_request(make_ssh: MakeSSH) -> None:
    sess = AgentSession(make_ssh(), PY, idle_s=0.3)
    first = sess.request("info")["executable"]
    time.sleep(0.5)
    assert sess.request("info")["executable"] == first
    assert sess.opened == 2
    sess.close()


def test_a_lost_master_is_reopened_and_the_session_with_it(make_ssh: MakeSSH) -> None:
    ssh = make_ssh()
    sess = AgentSession(ssh, PY)
    sess.request("info")
    pid = ssh.master_pid()
    assert pid is not None
    os.kill(pid, 9)
    assert sess.request("info")["elsewhere_version"]  # a new master, a new session
    assert ssh.connections_opened == 2 and sess.opened == 2
    sess.close()


def test_a_session_already_ended_with_its_master_is_opened_again_once(make_ssh: MakeSSH) -> None:
    # the race of the test above, taken the other way each time: the old session's ssh has
    # noticed the master's end before the next request comes
    ssh = make_ssh()
    sess = AgentSession(ssh, PY)
    sess.request("info")
    pid = ssh.master_pid()
    assert pid is not None and sess._proc is not None
    os.kill(pid, 9)
    sess._proc.wait(timeout=30)
    assert sess.request("info")["elsewhere_version"]
    assert ssh.connections_opened == 2 and sess.opened == 2
    sess.close()


def test_missing_python_and_missing_elsewhere_say_what_to_do(make_ssh: MakeSSH) -> None:
    with pytest.raises(RemoteSetupError) as info:
        AgentSession(make_ssh(), "/no/such/python3").request("info")
    assert "no Python '/no/such/python3' on ci" in str(info.value)
    bare = "/usr/bin/python3"
    if not os.path.exists(bare) or subprocess.run([bare, "-c", "import elsewhere"],
                                                  capture_output=True).returncode == 0:
        pytest.skip(f"no {bare} without elsewhere on this machine")
    with pytest.raises(RemoteSetupError) as info:
        AgentSession(make_ssh(), bare).request("info")
    assert "elsewhere is not installed" in str(info.value) and "pip install" in str(info.value)


def test_unreachable_host_is_host_unreachable(make_ssh: MakeSSH) -> None:
    sess = AgentSession(make_ssh("127.0.0.1", ssh_options=["Port=1"], ssh_config=None), PY)
    with pytest.raises(HostUnreachable) as info:
        sess.request("info", timeout_s=30)
    assert "127.0.0.1" in str(info.value)


# -- the agent's side of the wire, fed by a pipe ------------------------------------------

def _serve(*lines: bytes) -> tuple[int, list[dict[str, object]], str]:
    proc = subprocess.run([PY, "-m", "elsewhere.hosts.agent", "serve"], input=b"".join(lines),
                          capture_output=True, timeout=60)
    out = proc.stdout.decode()
    answers = [json.loads(line[len(MARKER):]) for line in out.splitlines() if line.startswith(MARKER)]
    return proc.returncode, answers, proc.stderr.decode()


def _req(id_: int, op: str, body: bytes = b"", **fields: object) -> bytes:
    head = {"v": 1, "id": id_, "op": op, **fields}
    if body:
        head["body"] = len(body)
    return json.dumps(head).encode() + b"\n" + body


def test_serve_takes_bodies_exactly_and_answers_in_order(tmp_path: Path) -> None:
    code, answers, _ = _serve(
        _req(1, "put", b"hello\nworld", dir=str(tmp_path), path="a/b.txt", truncate=True),
        _req(2, "put", b"\n{\"v\": 1}\n", dir=str(tmp_path), path="c.txt", truncate=True),
        _req(3, "info", dir=str(tmp_path)),
        _req(4, "put", b"!", dir=str(tmp_path), path="a/b.txt", offset=11),
    )
    assert code == 0
    assert [a["id"] for a in answers] == [3]
    assert (tmp_path / "a" / "b.txt").read_bytes() == b"hello\nworld!"
    assert (tmp_path / "c.txt").read_bytes() == b"\n{\"v\": 1}\n"


def test_serve_refuses_paths_that_leave_the_copy(tmp_path: Path) -> None:
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "job.json").write_text("{}")
    (tmp_path / "copy" / "out").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    code, answers, _ = _serve(
        _req(1, "put", b"x", dir=str(tmp_path / "copy"), path="../escaped"),
        _req(2, "put", b"y", dir=str(tmp_path / "copy"), path="out/through-link"),
        _req(3, "start", job=str(tmp_path / "copy"), workers=1, tasks="0:0"),
    )
    assert code == 0
    assert "unsafe path" in str(answers[0]["error"])
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "elsewhere" / "through-link").exists()


def test_serve_stops_on_a_request_it_cannot_trust(tmp_path: Path) -> None:
    code, answers, _ = _serve(b'{"v": 99, "id": 1, "op": "info"}\n', _req(2, "info"))
    assert code == 2 and len(answers) == 1
    assert answers[0]["id"] is None and "version" in str(answers[0]["error"])
    code, answers, _ = _serve(b"not json\n")
    assert code == 2 and "bad request" in str(answers[0]["error"])
