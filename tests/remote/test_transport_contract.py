"""The Transport contract, run against every transport (local, ssh) and every way of
moving files (local copies, rsync, tar through ssh with and without zstandard)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from subprocess import PIPE

import psutil
import pytest

from elsewhere.hosts import (
    CommandFailed,
    CommandTimeout,
    LocalTransport,
    Transport,
    remote_python_info,
)
from elsewhere.util.errors import CommandNotFound, ConfigError, RemoteSetupError, TransportError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PY = sys.executable  # the same interpreter exists on the "remote" host: it is this machine


def test_both_transports_satisfy_the_protocol(transport: Transport) -> None:
    assert isinstance(transport, Transport)


def test_run_returns_output_and_exit_code(transport: Transport) -> None:
    result = transport.run(["sh", "-c", "echo out; echo err >&2; exit 3"], check=False)
    assert (result.returncode, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert result.argv == ("sh", "-c", "echo out; echo err >&2; exit 3")
    assert result.host == transport.host
    assert result.seconds > 0


def test_run_passes_binary_input_and_output(transport: Transport) -> None:
    data = bytes(range(256)) * 1000
    result = transport.run(["cat"], input=data)
    assert result.stdout == data


def test_check_raises_command_failed_with_the_stderr_tail(transport: Transport) -> None:
    with pytest.raises(CommandFailed) as info:
        transport.run(["sh", "-c", "echo the reason >&2; exit 7"])
    err = info.value
    assert err.returncode == 7
    assert "the reason" in err.stderr
    assert err.host == transport.host
    assert "exit code: 7" in str(err) and "sh -c" in str(err)


def test_a_missing_command_is_exit_127_and_command_not_found(transport: Transport) -> None:
    result = transport.run(["no-such-command-ew"], check=False)
    assert result.returncode == 127
    with pytest.raises(CommandNotFound, match="no-such-command-ew"):
        result.check()


def test_env_adds_to_the_environment(transport: Transport) -> None:
    result = transport.run(
        ["sh", "-c", 'printf "%s|%s" "$EW_ONE" "$HOME"'], env={"EW_ONE": "a b $(x) 'q'"}
    )
    home = result.text.split("|")[1]
    assert result.text.split("|")[0] == "a b $(x) 'q'"
    assert home  # the rest of the environment is still there


def test_bad_env_names_are_refused(transport: Transport) -> None:
    with pytest.raises(ConfigError, match="not a valid identifier"):
        transport.run(["true"], env={"A B": "1"})


def test_cwd_sets_the_working_directory(transport: Transport, tmp_path: Path) -> None:
    folder = tmp_path / "a folder; $(echo x)"
    folder.mkdir()
    assert transport.run(["pwd"], cwd=str(folder)).text.strip() == str(folder)


def test_a_missing_cwd_fails_like_cd(transport: Transport, tmp_path: Path) -> None:
    result = transport.run(["pwd"], cwd=str(tmp_path / "missing"), check=False)
    assert result.returncode != 0
    assert b"missing" in result.stderr


def test_a_single_string_is_not_accepted_as_argv(transport: Transport) -> None:
    with pytest.raises(ConfigError, match="run_shell"):
        transport.run("echo hi")
    with pytest.raises(ConfigError, match="empty"):
        transport.run([])


@pytest.mark.timeout(30)
def test_timeout_kills_the_command_and_raises(transport: Transport) -> None:
    tag = f"{31 + os.getpid() % 1000}.{time.monotonic_ns() % 10**6}"  # unique sleep argument
    start = time.monotonic()
    with pytest.raises(CommandTimeout) as info:
        transport.run(["sleep", tag], timeout=1)
    assert time.monotonic() - start < 5
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, TransportError)
    # the command itself is gone, not only the local ssh client
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", tag]]
        if not left:
            break
        time.sleep(0.1)
    assert not left


def test_popen_streams_through_the_pipes(transport: Transport) -> None:
    proc = transport.popen(["sh", "-c", 'while read x; do echo "<$x>"; done'], stdin=PIPE)
    out, err = proc.communicate(b"one\ntwo words\n", timeout=30)
    assert (proc.returncode, out, err) == (0, b"<one>\n<two words>\n", b"")


def test_run_shell_runs_the_script_as_written(transport: Transport) -> None:
    script = "x='a b'; for w in $x; do printf '<%s>' \"$w\"; done; echo \"$(echo sub)\""
    assert transport.run_shell(script).text == "<a><b>sub\n"


def test_run_shell_with_another_shell(transport: Transport) -> None:
    result = transport.run_shell("echo ${BASH_VERSION:+bash}", shell=("bash",))
    assert result.text == "bash\n"


def test_spawn_detaches_and_returns_the_pid(transport: Transport, tmp_path: Path) -> None:
    log = tmp_path / "spawned.log"
    pid = transport.spawn(
        ["sh", "-c", "echo started $EW_X; sleep 0.3; echo done"],
        log_path=str(log),
        env={"EW_X": "yes"},
    )
    assert psutil.pid_exists(pid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "done" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.05)
    assert log.read_text() == "started yes\ndone\n"


def test_which_finds_commands_and_not_missing_ones(transport: Transport) -> None:
    found = transport.which("sh")
    assert found and found.endswith("/sh")
    assert transport.which("no-such-command-ew") is None


def test_remote_python_info_describes_the_interpreter(transport: Transport) -> None:
    info = remote_python_info(transport, PY)
    assert info["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert info["cpu_count"] == os.cpu_count()
    assert len(info["load_average"]) == 3
    assert info["mem_available_mb"] > 0
    assert "elsewhere_version" in info


def test_remote_python_info_names_a_missing_interpreter(transport: Transport) -> None:
    with pytest.raises(RemoteSetupError) as info:
        remote_python_info(transport, "/no/such/python3")
    assert "/no/such/python3" in str(info.value)
    assert transport.host in str(info.value)


# --- files -----------------------------------------------------------------------------------

NAMES = ["plain.txt", "with space.txt", 'quote\'d "x".txt', "semi;$(touch PWNED).txt", "-dash"]


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def _make_tree(root: Path) -> None:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    for i, name in enumerate(NAMES):
        (root / name).write_bytes(f"file {i}\n".encode() * (i + 1))
    (root / "sub" / "a.pkl").write_bytes(os.urandom(300_000))
    (root / "sub" / "deeper" / "b.log").write_text("log\n")
    (root / "sub" / "deeper" / "c.pkl").write_text("c\n")
    (root / "link").symlink_to("sub/a.pkl")
    (root / "script.sh").write_text("#!/bin/sh\n")
    (root / "script.sh").chmod(0o750)


def test_put_and_get_a_file(file_transport: Transport, tmp_path: Path) -> None:
    src = tmp_path / "src file;'x'.bin"
    src.write_bytes(os.urandom(1_000_000))
    os.utime(src, (1_600_000_000, 1_600_000_000))
    remote = tmp_path / "remote side" / "new folder" / "copy.bin"
    file_transport.put(src, str(remote))
    assert remote.read_bytes() == src.read_bytes()
    assert int(remote.stat().st_mtime) == 1_600_000_000
    back = tmp_path / "back" / "again.bin"
    file_transport.get(str(remote), back)
    assert back.read_bytes() == src.read_bytes()
    assert not (tmp_path / "PWNED").exists()


def test_put_and_get_a_folder(file_transport: Transport, tmp_path: Path) -> None:
    src = tmp_path / "src"
    _make_tree(src)
    remote = tmp_path / "remote" / "job folder"
    file_transport.put(src, str(remote))
    assert _tree(remote) == _tree(src)
    assert (remote / "empty").is_dir()
    assert os.readlink(remote / "link") == "sub/a.pkl"
    assert (remote / "script.sh").stat().st_mode & 0o777 == 0o750
    back = tmp_path / "back"
    file_transport.get(str(remote), back)
    assert _tree(back) == _tree(src)
    assert not list(tmp_path.rglob("PWNED"))


def test_put_overwrites_a_changed_file(file_transport: Transport, tmp_path: Path) -> None:
    src = tmp_path / "f"
    remote = tmp_path / "r" / "f"
    src.write_text("one")
    file_transport.put(src, str(remote))
    src.write_text("two")
    os.utime(src, (remote.stat().st_atime, remote.stat().st_mtime))  # same size, same mtime
    file_transport.put(src, str(remote))  # put always copies
    assert remote.read_text() == "two"


def test_get_a_missing_path_raises_file_not_found(
    file_transport: Transport, tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError):
        file_transport.get(str(tmp_path / "missing"), tmp_path / "x")
    with pytest.raises(FileNotFoundError):
        file_transport.put(tmp_path / "missing", str(tmp_path / "y"))


def test_sync_up_copies_only_what_changed(file_transport: Transport, tmp_path: Path) -> None:
    src, remote = tmp_path / "src", tmp_path / "remote"
    _make_tree(src)
    file_transport.sync_up(src, str(remote))
    assert _tree(remote) == _tree(src)
    kept = (remote / "sub" / "a.pkl").stat().st_ino
    changed = (remote / "plain.txt").stat().st_ino
    (src / "plain.txt").write_text("changed, and longer than before\n")
    (src / "sub" / "new.txt").write_text("new\n")
    (remote / "only-remote.txt").write_text("stays\n")
    file_transport.sync_up(src, str(remote))
    assert (remote / "sub" / "a.pkl").stat().st_ino == kept  # untouched: not copied again
    assert (remote / "plain.txt").stat().st_ino != changed
    assert (remote / "plain.txt").read_text() == "changed, and longer than before\n"
    assert (remote / "sub" / "new.txt").read_text() == "new\n"
    assert (remote / "only-remote.txt").exists()  # nothing is deleted


def test_sync_down_copies_only_what_changed(file_transport: Transport, tmp_path: Path) -> None:
    remote, local = tmp_path / "remote", tmp_path / "local"
    _make_tree(remote)
    file_transport.sync_down(str(remote), local)
    assert _tree(local) == _tree(remote)
    kept = (local / "sub" / "a.pkl").stat().st_ino
    (remote / "sub" / "deeper" / "b.log").write_text("more log lines\n")
    file_transport.sync_down(str(remote), local)
    assert (local / "sub" / "a.pkl").stat().st_ino == kept
    assert (local / "sub" / "deeper" / "b.log").read_text() == "more log lines\n"


def test_sync_down_with_include_patterns(file_transport: Transport, tmp_path: Path) -> None:
    remote, local = tmp_path / "remote", tmp_path / "local"
    _make_tree(remote)
    file_transport.sync_down(str(remote), local, include=["*.pkl"])
    assert sorted(_tree(local)) == ["sub/a.pkl", "sub/deeper/c.pkl"]
    other = tmp_path / "other"
    file_transport.sync_down(str(remote), other, include=["deeper/*", "/plain.txt"])
    assert sorted(_tree(other)) == ["plain.txt", "sub/deeper/b.log", "sub/deeper/c.pkl"]


def test_sync_down_of_a_missing_folder_raises(file_transport: Transport, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        file_transport.sync_down(str(tmp_path / "missing"), tmp_path / "local")


def test_local_transport_is_a_context_manager() -> None:
    with LocalTransport() as local:
        assert local.run(["true"]).ok
