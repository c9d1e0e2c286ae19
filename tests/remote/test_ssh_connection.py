"""One master connection per host, and ssh's failures as elsewhere's exceptions."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from elsewhere.hosts import SSHTransport, remote_python_info
from elsewhere.util.errors import (
    AuthenticationError,
    CommandNotFound,
    HostKeyError,
    HostUnreachable,
    RemoteSetupError,
    TransportError,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MakeSSH = Callable[..., SSHTransport]
SSHD = Any  # conftest.SSHD: folder, ssh_config, port, log, pid

ACCEPTED = re.compile(r"Accepted publickey for \S+ from 127\.0\.0\.1 port (\d+)")


def _accepted_ports(log: Path) -> list[int]:
    return [int(m.group(1)) for m in ACCEPTED.finditer(log.read_text(errors="replace"))]


def _wait_gone(pid: int, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    assert not psutil.pid_exists(pid), f"pid {pid} still runs"


def test_a_hundred_runs_open_one_connection(make_ssh: MakeSSH, sshd: SSHD) -> None:
    """100 commands, one login. Each client runs with a ProxyCommand that only fails, so a
    command that did not go through the master could not have succeeded at all."""
    before = len(_accepted_ports(sshd.log)) if sshd.log.exists() else None
    ssh = make_ssh()
    outputs = [ssh.run(["echo", str(i)]).text for i in range(100)]
    assert outputs == [f"{i}\n" for i in range(100)]
    assert ssh.connections_opened == 1
    pid = ssh.master_pid()
    assert pid is not None
    # the master's TCP connection, seen from the client and from sshd's log
    ports = {
        c.laddr.port
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == sshd.port
    }
    assert len(ports) == 1
    if before is not None:
        # others may use the CI sshd meanwhile: attribute logins by the client's port
        new = _accepted_ports(sshd.log)[before:]
        assert new.count(ports.pop()) == 1


def test_threads_share_the_one_master(make_ssh: MakeSSH) -> None:
    ssh = make_ssh()
    results: list[str] = []
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(3):
                results.append(ssh.run(["echo", f"{i}.{j}"]).text)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(results) == 48
    assert ssh.connections_opened == 1


def test_two_transports_to_one_host_share_a_master(make_ssh: MakeSSH) -> None:
    first, second = make_ssh(), make_ssh()
    first.run(["true"])
    second.run(["true"])
    assert (first.connections_opened, second.connections_opened) == (1, 0)
    assert first.master_pid() == second.master_pid()


def test_processes_racing_for_the_master_open_one(sshd: SSHD, control_dir: str) -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from elsewhere.hosts import SSHTransport;"
        "t = SSHTransport('ci', ssh_config=sys.argv[2], control_dir=sys.argv[3]);"
        "t.run(['true']); print(t.connections_opened, t.master_pid()); t.close(keep_master=True)"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, src, str(sshd.ssh_config), control_dir],
            stdout=subprocess.PIPE,
        )
        for _ in range(4)
    ]
    answers = [p.communicate(timeout=60)[0].split() for p in procs]
    opened = sum(int(a[0]) for a in answers)
    pids = {int(a[1]) for a in answers}
    assert (opened, len(pids)) == (1, 1)
    masters = [
        p
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and any(control_dir in word for word in p.info["cmdline"])
    ]
    assert [p.pid for p in masters] == list(pids)  # no stray connection left behind
    os.kill(pids.pop(), signal.SIGTERM)


def test_a_lost_master_is_replaced_and_counted(make_ssh: MakeSSH) -> None:
    ssh = make_ssh()
    ssh.run(["true"])
    pid = ssh.master_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # a master we started; leaves a stale socket behind
    _wait_gone(pid)
    assert ssh.run(["echo", "again"]).text == "again\n"
    assert ssh.connections_opened == 2
    assert ssh.master_pid() not in (None, pid)


def test_close_stops_the_master_and_later_use_raises(make_ssh: MakeSSH) -> None:
    ssh = make_ssh()
    ssh.run(["true"])
    pid = ssh.master_pid()
    assert pid is not None
    ssh.close()
    _wait_gone(pid)
    assert not os.path.exists(ssh.control_path)
    with pytest.raises(TransportError, match="closed"):
        ssh.run(["true"])


def test_keep_master_leaves_it_for_the_next_transport(make_ssh: MakeSSH) -> None:
    first = make_ssh()
    first.run(["true"])
    pid = first.master_pid()
    assert pid is not None
    first.close(keep_master=True)
    second = make_ssh()
    second.run(["true"])
    assert second.connections_opened == 0
    assert second.master_pid() == pid
    second.close()  # did not open it: leaves it running
    assert psutil.pid_exists(pid)
    os.kill(pid, signal.SIGTERM)


def test_control_folder_is_private(make_ssh: MakeSSH, control_dir: str) -> None:
    os.chmod(control_dir, 0o755)
    ssh = make_ssh()
    ssh.run(["true"])
    assert os.stat(control_dir).st_mode & 0o777 == 0o700
    assert ssh.control_path.startswith(control_dir + "/")


def test_a_long_control_folder_falls_back_to_a_short_one(
    make_ssh: MakeSSH, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    long_dir = tmp_path / ("x" * 60) / ("y" * 60)
    ssh = make_ssh(control_dir=long_dir)
    assert len(ssh.control_path.encode()) + 17 < 104
    assert "too long" in caplog.text
    assert ssh.run(["echo", "ok"]).text == "ok\n"


# --- failures ---------------------------------------------------------------------------------


def _config(path: Path, sshd: SSHD, **overrides: str) -> Path:
    """A copy of the CI ssh_config for host ``ci`` with some settings replaced."""
    settings = {
        "HostName": "127.0.0.1",
        "Port": str(sshd.port),
        "User": "root",
        "IdentityFile": str(sshd.folder / "id_ed25519"),
        "IdentitiesOnly": "yes",
        "UserKnownHostsFile": str(sshd.folder / "known_hosts"),
        "StrictHostKeyChecking": "yes",
    }
    settings.update(overrides)
    path.write_text("Host ci\n" + "".join(f"  {k} {v}\n" for k, v in settings.items()))
    return path


def test_a_wrong_key_is_an_authentication_error(
    make_ssh: MakeSSH, sshd: SSHD, tmp_path: Path
) -> None:
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    ssh = make_ssh(ssh_config=_config(tmp_path / "cfg", sshd, IdentityFile=str(key)))
    with pytest.raises(AuthenticationError) as info:
        ssh.run(["true"])
    message = str(info.value)
    assert "ci" in message and "check the user name and your key" in message
    assert "Permission denied" in info.value.stderr
    assert ssh.connections_opened == 0


def test_an_unknown_host_key_is_a_host_key_error(
    make_ssh: MakeSSH, sshd: SSHD, tmp_path: Path
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    ssh = make_ssh(ssh_config=_config(tmp_path / "cfg", sshd, UserKnownHostsFile=str(empty)))
    with pytest.raises(HostKeyError, match="ssh-keyscan"):
        ssh.run(["true"])


def test_a_changed_host_key_is_a_host_key_error(
    make_ssh: MakeSSH, sshd: SSHD, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = tmp_path / "known_hosts"
    key = " ".join(Path(f"{other}.pub").read_text().split()[:2])
    known.write_text(f"[127.0.0.1]:{sshd.port} {key}\n")
    ssh = make_ssh(ssh_config=_config(tmp_path / "cfg", sshd, UserKnownHostsFile=str(known)))
    with pytest.raises(HostKeyError, match="CHANGED") as info:
        ssh.run(["true"])
    assert "ssh-keygen -R" in str(info.value)


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_closed_port_is_host_unreachable(make_ssh: MakeSSH, sshd: SSHD, free_port: int) -> None:
    ssh = make_ssh("127.0.0.1", port=free_port, ssh_config=sshd.ssh_config)
    with pytest.raises(HostUnreachable, match="is sshd running") as info:
        ssh.run(["true"])
    assert f"port {free_port}" in str(info.value)


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server on loopback that accepts and then says nothing."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.timeout(60)
def test_a_silent_host_times_out_as_host_unreachable(
    make_ssh: MakeSSH, sshd: SSHD, silent_server: int
) -> None:
    ssh = make_ssh("127.0.0.1", port=silent_server, ssh_config=sshd.ssh_config, connect_timeout_s=1)
    start = time.monotonic()
    with pytest.raises(HostUnreachable):
        ssh.run(["true"])
    assert time.monotonic() - start < 40


def test_no_ssh_client_is_command_not_found(
    make_ssh: MakeSSH, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CommandNotFound, match="openssh-client"):
        make_ssh().run(["true"])


def test_no_local_rsync(make_ssh: MakeSSH, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ssh", "sh"):
        (bin_dir / tool).symlink_to(shutil.which(tool))  # type: ignore[arg-type]
    monkeypatch.setenv("PATH", str(bin_dir))
    src = tmp_path / "f"
    src.write_text("x")
    with pytest.raises(CommandNotFound, match="rsync"):
        make_ssh(transfer="rsync").put(src, str(tmp_path / "a"))
    make_ssh(transfer="auto").put(src, str(tmp_path / "b"))  # falls back to tar
    assert (tmp_path / "b").read_text() == "x"


def test_no_python_for_the_tar_fallback_is_remote_setup_error(
    make_ssh: MakeSSH, tmp_path: Path
) -> None:
    src = tmp_path / "f"
    src.write_text("x")
    ssh = make_ssh(transfer="tar", python="/no/such/python3")
    with pytest.raises(RemoteSetupError, match="/no/such/python3") as info:
        ssh.put(src, str(tmp_path / "a"))
    assert "ci" in str(info.value)
    with pytest.raises(RemoteSetupError, match="/no/such/python3"):
        remote_python_info(ssh, "/no/such/python3")


def _master_option(pid: int, name: str) -> str | None:
    """The value of ``-o NAME=...`` on the master ssh's command line, or None."""
    argv = psutil.Process(pid).cmdline()
    for flag, opt in zip(argv, argv[1:]):
        if flag == "-o" and opt.lower().startswith(name.lower() + "="):
            return opt.split("=", 1)[1]
    return None


def test_the_master_puts_aes_gcm_first_where_the_cpu_has_aes(make_ssh: MakeSSH, monkeypatch) -> None:
    # ChaCha20-Poly1305, OpenSSH's first default, has no hardware help: AES-GCM moves data
    # two to three times as fast on a CPU with AES instructions (bench/ssh.py, big)
    from elsewhere.hosts import ssh as ssh_module

    monkeypatch.setattr(ssh_module, "aes_in_hardware", lambda: True)
    ssh = make_ssh()
    assert ssh.run(["echo", "hi"]).text == "hi\n"
    ciphers = _master_option(ssh.master_pid(), "Ciphers")
    assert ciphers is not None and ciphers.split(",")[:2] == ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com"]
    assert "chacha20-poly1305@openssh.com" in ciphers.split(",")  # the client's others kept, after


def test_ciphers_the_user_chose_are_left_alone(make_ssh: MakeSSH, sshd: SSHD, tmp_path: Path, monkeypatch) -> None:
    from elsewhere.hosts import ssh as ssh_module

    monkeypatch.setattr(ssh_module, "aes_in_hardware", lambda: True)
    config = tmp_path / "ssh_config"
    config.write_text(Path(sshd.ssh_config).read_text() + "  Ciphers chacha20-poly1305@openssh.com\n")
    by_config = make_ssh(ssh_config=str(config))
    by_option = make_ssh(ssh_options=["Ciphers=aes256-ctr"])
    for ssh in (by_config, by_option):
        assert ssh.run(["echo", "hi"]).text == "hi\n"
    assert _master_option(by_config.master_pid(), "Ciphers") is None  # the file's line holds
    assert _master_option(by_option.master_pid(), "Ciphers") == "aes256-ctr"  # theirs alone


def test_no_cipher_preference_without_aes_instructions(make_ssh: MakeSSH, monkeypatch) -> None:
    from elsewhere.hosts import ssh as ssh_module

    monkeypatch.setattr(ssh_module, "aes_in_hardware", lambda: False)
    ssh = make_ssh(ssh_options=["ServerAliveCountMax=5"])  # a master of its own (another key)
    assert ssh.run(["echo", "hi"]).text == "hi\n"
    assert _master_option(ssh.master_pid(), "Ciphers") is None
