"""Help from the shell: ``elsewhere`` alone lists what it can do, and every command and
argument says what it is for."""

from __future__ import annotations

import argparse

import pytest

from cli.conftest import Shell
from elsewhere.api.cli import build_parser

pytestmark = pytest.mark.timeout(120)


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]):
    """(command path, parser, action) for every argument of every (sub-)command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {a.dest for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield path + (name,), sub, ("<command>", name in helped)
                yield from _walk(sub, path + (name,))
        else:
            yield path, parser, action


def test_no_arguments_prints_the_help(tmp_path):
    shell = Shell(tmp_path / "home", tmp_path / "config")
    for args in ((), ("--debug",)):
        p = shell(*args)
        assert p.returncode == 0 and p.stderr == "", p.stderr
        assert p.stdout.startswith("usage: elsewhere")
        for command in ("jobs", "status", "wait", "results", "logs", "errors", "cancel", "purge",
                        "workers", "template", "doctor", "peer", "demo"):  # fmt: skip
            assert f"\n    {command} " in p.stdout, command
        assert "exit codes:" in p.stdout and "124" in p.stdout
    assert not (tmp_path / "home").exists()  # help touches nothing


def test_every_command_and_argument_has_help_text(tmp_path):
    missing = []
    for path, _parser, action in _walk(build_parser(), ("elsewhere",)):
        if isinstance(action, tuple):
            if not action[1]:
                missing.append(" ".join(path))
        elif action.help is None and not isinstance(action, argparse._HelpAction):
            missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"without help text: {missing}"
    # and the real command shows them: the commands whose arguments had none before
    shell = Shell(tmp_path / "home", tmp_path / "config")
    parsers = {path: parser for path, parser, _ in _walk(build_parser(), ("elsewhere",))}
    for path in (("elsewhere", "wait"), ("elsewhere", "workers"), ("elsewhere", "template"),
                 ("elsewhere", "demo"), ("elsewhere", "errors"), ("elsewhere", "peer", "list")):  # fmt: skip
        p = shell(*path[1:], "--help")
        assert p.returncode == 0, p.stderr
        text = " ".join(p.stdout.split())
        for action in parsers[path]._actions:
            if action.help and action.help != argparse.SUPPRESS:
                assert " ".join(action.help.split()) in text, (path, action.help)
