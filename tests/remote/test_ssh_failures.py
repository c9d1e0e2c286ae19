"""ssh's error text, classified: captured from OpenSSH 9.2 (and older clients' wording)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from elsewhere.hosts import SSHTransport, parse_ssh_failure
from elsewhere.util.errors import AuthenticationError, HostKeyError, HostUnreachable

CAPTURED = {
    "hostkey-changed": (
        "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\r\n"
        "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\r\n"
        "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\r\n"
        "IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\r\n"
        "Host key for [127.0.0.1]:2222 has changed and you have requested strict checking.\r\n"
        "Host key verification failed.\r\n"
    ),
    "hostkey-unknown": (
        "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict "
        "checking.\r\nHost key verification failed.\r\n"
    ),
    "auth": "root@127.0.0.1: Permission denied (publickey).\r\n",
    "resolve": "ssh: Could not resolve hostname nosuchhost.invalid: Name or service not known\r\n",
    "refused": "ssh: connect to host 127.0.0.1 port 1: Connection refused\r\n",
    "timeout": "ssh: connect to host 10.1.2.3 port 22: Connection timed out\r\n",
    "route": "ssh: connect to host 10.1.2.3 port 22: No route to host\r\n",
    "closed": "kex_exchange_identification: read: Connection reset by peer\r\n",
}


@pytest.mark.parametrize("kind", sorted(CAPTURED))
def test_captured_failures_are_classified(kind: str) -> None:
    assert parse_ssh_failure(CAPTURED[kind]) == kind


@pytest.mark.parametrize(
    "text",
    ["", "bash: line 1: foo: command not found\n", "Traceback (most recent call last):\n"],
)
def test_other_text_is_not_a_connection_failure(text: str) -> None:
    assert parse_ssh_failure(text) is None


@pytest.mark.parametrize(
    ("kind", "cls", "advice"),
    [
        ("hostkey-changed", HostKeyError, "ssh-keygen -R 127.0.0.1"),
        ("hostkey-unknown", HostKeyError, "ssh-keyscan -p 2222 127.0.0.1"),
        ("auth", AuthenticationError, "ssh-agent"),
        ("resolve", HostUnreachable, "spelling"),
        ("refused", HostUnreachable, "is sshd running"),
        ("timeout", HostUnreachable, "did not answer within 10 s"),
        ("route", HostUnreachable, "no network route"),
        ("closed", HostUnreachable, "closed the ssh connection"),
    ],
)
def test_each_failure_becomes_an_exception_with_advice(kind: str, cls: type, advice: str) -> None:
    transport = SSHTransport("root@127.0.0.1", port=2222)
    error = transport.connection_error(CAPTURED[kind], command=["squeue"], returncode=255)
    assert type(error) is cls
    message = str(error)
    assert advice in message
    assert "root@127.0.0.1" in message and "squeue" in message
    assert error is not None and error.host == "root@127.0.0.1"


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_command_exiting_255_is_not_mistaken_for_ssh(ssh: SSHTransport) -> None:
    result = ssh.run(["sh", "-c", "echo some words >&2; exit 255"], check=False)
    assert result.returncode == 255
    assert result.stderr == b"some words\n"


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_remote_command_not_found_names_the_host(ssh: SSHTransport, tmp_path: Path) -> None:
    result = ssh.run([str(tmp_path / "no such program")], check=False)
    assert result.returncode == 127


@pytest.mark.timeout(60)
def test_processes_waiting_for_a_failing_login_take_its_failure_not_a_timeout_each() -> None:
    """Several clients open the master connection to one host at once, and the host does
    not answer: one logs in (a connection timeout), the others, which waited for its lock,
    fail with its error at once. Before, each tried in turn: N clients, N timeouts."""
    import fcntl
    import os
    import socket
    import threading

    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never says a word
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        silent.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(silent.accept()[0])
            except TimeoutError:
                pass

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    port = silent.getsockname()[1]

    folder = tempfile.mkdtemp(prefix="ew-cm-", dir="/tmp")  # short: a socket's path

    def client() -> SSHTransport:
        return SSHTransport("root@127.0.0.1", port=port, connect_timeout_s=1, control_dir=folder,
                            ssh_options=["StrictHostKeyChecking=no", "BatchMode=yes"])  # fmt: skip

    errors: list[BaseException] = []

    def run() -> None:
        try:
            client().run(["true"], timeout=20)
        except BaseException as exc:
            errors.append(exc)

    lock = os.open(client().control_path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # all three are waiting when the first may try
    try:
        threads = [threading.Thread(target=run) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
    finally:
        os.close(lock)
    for t in threads:
        t.join(timeout=40)
    stop.set()
    server.join(timeout=5)
    for s in [silent, *accepted]:
        s.close()
    shutil.rmtree(folder, ignore_errors=True)
    assert not any(t.is_alive() for t in threads)
    assert len(errors) == 3 and all(type(e) is HostUnreachable for e in errors), errors
    assert len(accepted) == 1, f"{len(accepted)} logins to a host that does not answer"
    assert sum("another process" in str(e) for e in errors) == 2
