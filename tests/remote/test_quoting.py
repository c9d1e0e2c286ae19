"""Every word that reaches a remote shell arrives exactly as given, and nothing in it runs.

The first tests need no sshd: they feed the command line that SSHTransport would
send to real local shells (dash, bash), which is what sshd does with it. The
others go through the CI sshd.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from elsewhere.hosts import SSHTransport, build_remote_command, build_rsync_rsh
from elsewhere.util.errors import ConfigError

PY = sys.executable
ECHO_ARGV = "import json, sys; sys.stdout.write(json.dumps(sys.argv[1:]))"


def no_marker(marker: Path, *folders: Path) -> bool:
    """True when no file named like ``marker`` appeared where a stray ``touch`` could put it:
    beside it, in the home folder, in this process's folder, or in ``folders``."""
    places = [marker.parent, Path.home(), Path.cwd(), *folders]
    return not any((place / marker.name).exists() for place in places)


def nasty(marker: Path) -> list[str]:
    """Arguments that would run something, or split, if quoting were wrong."""
    m = str(marker)
    return [
        "plain",
        "with space",
        "  leading and trailing  ",
        "tab\there",
        "single'quote",
        'double"quote',
        "semi;colon",
        f"$(touch {m})",
        f"`touch {m}`",
        f"; touch {m}",
        f"&& touch {m}",
        f"| touch {m}",
        f"> {m}",
        f"\ntouch {m}\n",
        "$HOME ${HOME} $0 $@",
        "back\\slash \\n",
        "glob * ? [a-z]",
        "~",
        "~root",
        "-n",
        "--",
        "",
        "#not a comment",
        "!bang",
        "'\"'\"'",
        "unicode ✓ ü 字",
        "%s %n",
    ]


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_command_line_survives_a_real_shell(shell: str, tmp_path: Path) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell} here")
    marker = tmp_path / "PWNED"
    words = nasty(marker)
    line = build_remote_command([PY, "-c", ECHO_ARGV, *words])
    out = subprocess.run([shell, "-c", line], capture_output=True, check=True, timeout=30)
    assert json.loads(out.stdout) == words
    assert no_marker(marker)


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_env_cwd_and_timeout_are_quoted_too(shell: str, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    folder = tmp_path / f"dir '$(touch {marker.name})' x"
    folder.mkdir()
    value = f"v $(touch {marker}) `touch {marker}` 'q' \"d\""
    script = "import json, os; print(json.dumps([os.getcwd(), os.environ['EW_V']]))"
    line = build_remote_command(
        [PY, "-c", script], env={"EW_V": value}, cwd=str(folder), timeout=30
    )
    out = subprocess.run([shell, "-c", line], capture_output=True, check=True, timeout=30)
    assert json.loads(out.stdout) == [str(folder), value]
    assert no_marker(marker, folder)


def test_build_remote_command_quotes_every_word() -> None:
    assert build_remote_command(["echo", "a b", "$(x)"]) == "echo 'a b' '$(x)'"
    assert build_remote_command(["ls"], cwd="/a b") == "cd '/a b' && ls"
    assert build_remote_command(["ls"], env={"A": "1 2"}) == "env 'A=1 2' ls"


def _rsync_split(command: str) -> list[str]:
    """rsync's own splitting of -e (main.c, do_cmd), for checking our quoting."""
    args: list[str] = []
    i, n = 0, len(command)
    while i < n:
        if command[i] == " ":
            i += 1
            continue
        word, quote = [], ""
        while i < n and (command[i] != " " or quote):
            c = command[i]
            if c in "'\"":
                if not quote:
                    quote = c
                    i += 1
                    continue
                if c == quote:
                    if i + 1 < n and command[i + 1] == quote:
                        word.append(c)
                        i += 2
                        continue
                    quote = ""
                    i += 1
                    continue
            word.append(c)
            i += 1
        args.append("".join(word))
    return args


def test_rsync_rsh_quoting_round_trips() -> None:
    argv = ["ssh", "-o", 'ProxyCommand=sh -c "echo x >&2; exit 255"', "-o", "A='b c'", "plain"]
    assert _rsync_split(build_rsync_rsh(argv)) == argv


@pytest.mark.parametrize(
    "destination",
    ["host:22", "user@host:2222", "-oProxyCommand=touch x", "ho st", "ssh://host:22", ""],
)
def test_destinations_that_ssh_would_misread_are_refused(destination: str) -> None:
    with pytest.raises(ConfigError):
        SSHTransport(destination)


def test_host_port_syntax_points_to_the_port_argument() -> None:
    with pytest.raises(ConfigError, match=r"port=2222"):
        SSHTransport("user@host:2222")


def test_ipv6_and_aliases_are_accepted() -> None:
    assert SSHTransport("::1").host == "::1"
    assert SSHTransport("user@my-alias").host == "user@my-alias"


def test_ssh_options_must_be_key_value() -> None:
    with pytest.raises(ConfigError):
        SSHTransport("host", ssh_options=["-oProxyCommand=x"])
    with pytest.raises(ConfigError):
        SSHTransport("host", ssh_options=["Compression"])


# --- through the CI sshd --------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_nasty_arguments_reach_the_remote_command_intact(ssh: SSHTransport, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    words = nasty(marker)
    result = ssh.run([PY, "-c", ECHO_ARGV, *words])
    assert json.loads(result.stdout) == words
    assert no_marker(marker)


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_nasty_env_cwd_and_input_over_ssh(ssh: SSHTransport, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    folder = tmp_path / f"job '$(touch {marker.name})';`touch {marker.name}`\nname"
    folder.mkdir()
    value = f"$(touch {marker}); `touch {marker}` \"'\n"
    script = (
        "import json, os, sys; "
        "print(json.dumps([os.getcwd(), os.environ['EW_V'], sys.stdin.read()]))"
    )
    result = ssh.run(
        [PY, "-c", script], env={"EW_V": value}, cwd=str(folder), input=value.encode(), timeout=30
    )
    assert json.loads(result.stdout) == [str(folder), value, value]
    assert no_marker(marker, folder)


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_nasty_names_in_spawn_and_which(ssh: SSHTransport, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    log = tmp_path / f"log $(touch {marker.name}).txt"
    pid = ssh.spawn(["echo", f"`touch {marker}`"], log_path=str(log))
    assert pid > 0
    assert ssh.which(f"sh; touch {marker}") is None
    for _ in range(100):
        if log.exists() and log.read_text():
            break
        time.sleep(0.05)
    assert log.read_text() == f"`touch {marker}`\n"
    assert no_marker(marker)


@pytest.mark.integration
@pytest.mark.timeout(60)
@pytest.mark.parametrize("transfer", ["rsync", "tar"])
def test_nasty_file_names_in_transfers(
    make_ssh: Callable[..., SSHTransport], transfer: str, tmp_path: Path
) -> None:
    marker = tmp_path / "PWNED"
    t = make_ssh("ci", transfer=transfer, python=PY)
    src = tmp_path / f"src $(touch {marker.name})"
    src.mkdir()
    names = [f"a'b;`touch {marker.name}`", "new\nline", "-rf", "sp ace", "*"]
    for name in names:
        (src / name).write_text(name)
    remote = tmp_path / f"remote '$(touch {marker.name})'" / "-x"
    t.put(src, str(remote))
    assert sorted(p.name for p in remote.iterdir()) == sorted(names)
    back = tmp_path / "back"
    t.sync_down(str(remote), back)
    assert {p.name: p.read_text() for p in back.iterdir()} == {n: n for n in names}
    assert no_marker(marker, src, remote, remote.parent, back)


def test_cipher_choice_from_ssh_config_dumps() -> None:
    from elsewhere.hosts.openssh import choose_ciphers, parse_ssh_config_dump

    default = parse_ssh_config_dump("user root\nciphers chacha20-poly1305@openssh.com,aes128-gcm@openssh.com\n")
    preferred = {"ciphers": "aes128-gcm@openssh.com,chacha20-poly1305@openssh.com"}
    assert default["ciphers"].startswith("chacha20")
    assert choose_ciphers(default, preferred, default) == "Ciphers=aes128-gcm@openssh.com,chacha20-poly1305@openssh.com"
    assert choose_ciphers(default, preferred, {"ciphers": "aes256-ctr"}) is None  # the user chose
    assert choose_ciphers(default, None, default) is None  # a client too old for "^"
    assert choose_ciphers(None, preferred, default) is None  # ssh -G failed
    assert choose_ciphers(preferred, preferred, preferred) is None  # AES first already
    dump = parse_ssh_config_dump("identityfile ~/.ssh/a\nidentityfile ~/.ssh/b\nCiphers x\n")
    assert dump == {"identityfile": "~/.ssh/a", "ciphers": "x"}
