"""ssh's error text, classified: captured from OpenSSH 9.2 (and older clients' wording)."""

from __future__ import annotations

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
