"""What the shell prints for people, fitted to where it goes: colour only on a terminal and
never with NO_COLOR; on a pipe no line wrapped inside a command and no table squeezed to 80
columns; one line per template."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import time

import pytest

from cli.conftest import COMMAND, strict_json

pytestmark = pytest.mark.timeout(180)

#: an SGR sequence that sets a colour (foreground or background, 16, 256 or true colour)
COLOUR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-9]|4[0-9]|9[0-7]|10[0-7])(?:;[0-9;]*)?m")


def on_a_terminal(shell, *args: str, **env: str) -> str:
    """``elsewhere ARGS`` with a pseudo-terminal as its stdout and stderr; what it wrote."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*COMMAND, *args], stdout=follower, stderr=follower, stdin=subprocess.DEVNULL,
                            env={**shell.env, "TERM": "xterm-256color", **env})  # fmt: skip
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the other end is closed
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=30) == 0, out
    return out.decode(errors="replace")


def test_colour_on_a_terminal_only_and_never_with_no_color(jobs):
    coloured = on_a_terminal(jobs, "results", "fits")
    assert "ValueError" in coloured and COLOUR.search(coloured), repr(
        coloured
    )  # the failed task in red
    plain = on_a_terminal(jobs, "results", "fits", NO_COLOR="1")
    assert "ValueError: bad input" in plain and not COLOUR.search(plain), repr(plain)
    for args in (("results", "fits"), ("jobs",)):
        piped = jobs(*args)
        assert piped.returncode == 0 and "\x1b[" not in piped.stdout, (args, piped.stdout)


def test_a_table_on_a_pipe_is_not_squeezed_to_80_columns(shell):
    name = "a-long-job-name-" + "x" * 84  # 100 characters: a table of 80 columns would wrap it
    shell.python(f"""
        import elsewhere as ew
        ew.submit(abs, [-1], name={name!r}, on=ew.local(cores=1)).wait(timeout=60)
    """)
    table = shell("jobs")
    assert table.returncode == 0, table.stderr
    row = [line for line in table.stdout.splitlines() if name in line]
    assert len(row) == 1 and "finished" in row[0], table.stdout  # the whole name, on its row


def test_the_demos_next_steps_are_whole_commands_on_a_pipe(shell):
    demo = shell("demo", "--tasks", "2", "--samples", "2000", timeout=120)
    assert demo.returncode == 0, demo.stderr
    name = re.search(r"submitted job (demo-\d+)", demo.stdout).group(1)
    lines = [line.strip() for line in demo.stdout.splitlines()]
    for verb in ("status", "results", "purge"):
        assert f"elsewhere {verb} {name}" in lines, demo.stdout  # a line of its own, unbroken


def test_the_template_list_names_each_template_once(shell):
    assert shell("template", "install", "slurm").returncode == 0
    listed = shell("template", "list")
    names = [line.split("\t")[0] for line in listed.stdout.splitlines()]
    assert names.count("slurm") == 1 and len(names) == len(set(names)), listed.stdout
    (slurm,) = [line for line in listed.stdout.splitlines() if line.startswith("slurm\t")]
    assert "yours" in slurm and "used instead of the built-in one" in slurm
    rows = strict_json(shell("template", "list", "--json").stdout)
    assert [r for r in rows if r["name"] == "slurm"] == [
        {"name": "slurm", "source": "yours", "path": str(shell.config / "templates" / "slurm.j2"),
         "replaces_builtin": True}]  # fmt: skip
    assert {"name": "sge", "source": "built in", "path": None, "replaces_builtin": False} in rows
