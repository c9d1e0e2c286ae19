"""The ``elsewhere`` command: the job verbs from a shell.

    elsewhere jobs [--json]           the registry
    elsewhere status NAME [--json]    counts per state
    elsewhere wait NAME [--timeout S] block with a progress bar
    elsewhere results NAME [--json]   print the results
    elsewhere logs NAME [TASK]        captured output
    elsewhere errors NAME [TASK]      failed tasks' remote tracebacks
    elsewhere cancel NAME             stop it
    elsewhere purge NAME              delete it
    elsewhere workers stop            stop the warm local workers
    elsewhere template list|show|install|edit [NAME]   job-script templates
    elsewhere doctor PROFILE_OR_HOST  check a profile or ssh host; say what to fix
    elsewhere peer worker|stop|list|keygen   the peer network
    elsewhere web [--port N] [--read-only]   a live web view (pip install 'elsewhere[web]')
    elsewhere demo                    the main job of the README

Here: the parser and :func:`main`. What each verb does is ``commands.py`` (the peer ones
``peer_cli.py``); how an error becomes one line and an exit code is ``exits.py``; the value
types and the one-line usage errors are ``argtypes.py``; strict JSON is ``jsonout.py``.
docs/cli.md is the user's page.
"""

from __future__ import annotations

import argparse

from ..util.docsite import page
from . import exits
from .argtypes import Parser, count, seconds, task_index


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``elsewhere`` command and its sub-commands."""
    from ..util.version import __version__
    from . import commands  # here, not above: `elsewhere` on a system it cannot run on says so

    p = Parser(prog="elsewhere", description="Run Python functions as tasks elsewhere.", epilog=exits.EPILOG,
               formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--version", action="version", version=f"elsewhere {__version__}")
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of an error (also: ELSEWHERE_DEBUG=1)")  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("jobs", help="list the jobs in the registry")
    s.add_argument("--json", action="store_true", help=f"as strict JSON (see {page('cli')})")
    s.set_defaults(func=commands.cmd_jobs)

    s = sub.add_parser("status", help="counts of tasks per state")
    s.add_argument("name", help="the job's name or id")
    s.add_argument("--json", action="store_true", help="as strict JSON, on one line")
    s.set_defaults(func=commands.cmd_status)

    s = sub.add_parser("wait", help="wait for a job to end (progress bar on a terminal)",
                       description="Wait for a job to end. Exit code 0 if it finished, 1 if it ended "
                       "failed or cancelled, 124 if --timeout ran out (it goes on running), 2 if there "
                       "is no such job (or it was purged while waited for).")  # fmt: skip
    s.add_argument("name", help="the job's name or id")
    s.add_argument("--timeout", type=seconds, default=None, metavar="DURATION",
                   help="give up after this long: seconds (90), or 90s, 5min, 1h30m")  # fmt: skip
    s.add_argument("--no-progress", action="store_true", help="no progress bar, even on a terminal")
    s.add_argument("--json", action="store_true", help="its state at the end as strict JSON")
    s.set_defaults(func=commands.cmd_wait)

    s = sub.add_parser("results", help="print a job's results")
    s.add_argument("name", help="the job's name or id")
    s.add_argument("--json", action="store_true",
                   help="as strict JSON: NaN and infinities as the strings \"NaN\", \"Infinity\", "
                   "\"-Infinity\"")  # fmt: skip
    s.add_argument("--compact", action="store_true", help="one line of JSON")
    s.add_argument("--partial", action="store_true", help="do not insist that every task is done")
    s.set_defaults(func=commands.cmd_results)

    s = sub.add_parser("logs", help="captured stdout and stderr of a task (or of all)")
    s.add_argument("name", help="the job's name or id")
    s.add_argument(
        "task", nargs="?", type=task_index, help="the task's index: 0 to the job's tasks - 1"
    )
    s.add_argument("--json", action="store_true",
                   help='as strict JSON: a list of {"task": i, "log": text}')  # fmt: skip
    s.set_defaults(func=commands.cmd_logs)

    s = sub.add_parser("errors", help="the remote traceback of a failed task (or of every one)",
                       description="Print what failed tasks raised, with the traceback from where "
                       "they ran; a task lost with its worker (or killed) has its reason instead.")  # fmt: skip
    s.add_argument("name", help="the job's name or id")
    s.add_argument("task", nargs="?", type=task_index,
                   help="the task's index (default: every failed task)")  # fmt: skip
    s.add_argument("--json", action="store_true",
                   help='as strict JSON: a list of {"task", "type", "message", "reason", "host", '
                   '"seed", "traceback"}')  # fmt: skip
    s.set_defaults(func=commands.cmd_errors)

    s = sub.add_parser("cancel", help="stop a job")
    s.add_argument("name", help="the job's name or id")
    s.set_defaults(func=commands.cmd_cancel)

    s = sub.add_parser("purge", help="delete a job and its folder",
                       description="Delete a job: stop it, remove its folder and its registry entry. "
                       "Of several purges of one job at once, one succeeds; the others say the job "
                       "is gone (exit code 2).")  # fmt: skip
    s.add_argument("name", help="the job's name or id")
    s.set_defaults(func=commands.cmd_purge)

    s = sub.add_parser("workers", help="manage warm local workers")
    s.add_argument("action", choices=["stop"],
                   help="stop: ask the idle warm local workers (of any Python) to exit")  # fmt: skip
    s.set_defaults(func=commands.cmd_workers)

    s = sub.add_parser("template", help="job-script templates: list, show, install, edit")
    s.add_argument("action", choices=["list", "show", "install", "edit"],
                   help="list them; show one; install a copy to edit (in the config folder); edit "
                   "yours ($VISUAL or $EDITOR)")  # fmt: skip
    s.add_argument("name", nargs="?", help="the template's name (a scheduler's, or yours)")
    s.add_argument("--source", help="the built-in template to start from (default: NAME)")
    s.add_argument("--force", action="store_true", help="overwrite an installed template")
    s.add_argument("--json", action="store_true", help="list: as strict JSON")
    s.set_defaults(func=commands.cmd_template)

    s = sub.add_parser(
        "doctor", help="check that a profile or an ssh host can run tasks, and say what to fix"
    )
    s.add_argument(
        "target", metavar="PROFILE_OR_HOST", help="a profile name, 'local', or an ssh destination"
    )
    s.add_argument("--python", help="the interpreter on the host (default: python3)")
    s.add_argument("--remote-storage", help="the job-copy folder on the host")
    s.add_argument("--ssh-config", help="an ssh config file to use instead of ~/.ssh/config")
    s.add_argument("-o", dest="ssh_option", action="append", metavar="KEY=VALUE",
                   help="an ssh option, as after ssh -o (repeatable)")  # fmt: skip
    s.add_argument("--json", action="store_true",
                   help='the checks as strict JSON: a list of {"name", "ok", "detail", "fix"}')  # fmt: skip
    s.set_defaults(func=commands.cmd_doctor)

    from .peer_cli import add_peer_commands

    add_peer_commands(sub)

    from .web.cli import add_web_command

    add_web_command(sub)

    s = sub.add_parser("demo", help="run the demo job: pi on local workers, with its speed-up")
    s.add_argument("--tasks", type=count, default=None,
                   help="how many tasks (default: 4 per core, at least 4)")  # fmt: skip
    s.add_argument("--samples", type=count, default=1_500_000,
                   help="random points per task (default: 1500000)")  # fmt: skip
    s.set_defaults(func=commands.cmd_demo)
    _debug_everywhere(sub)
    return p


def _debug_everywhere(sub: argparse._SubParsersAction) -> None:
    """``--debug`` after a sub-command too (``elsewhere status NAME --debug``); SUPPRESS, so that
    a sub-command's default does not undo the main command's flag."""
    for parser in set(sub.choices.values()):
        parser.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                _debug_everywhere(action)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``elsewhere`` command; returns its exit code (``exits``)."""
    import sys

    from ..util.system import missing_fcntl

    unsupported = missing_fcntl()
    if unsupported is not None:  # before the commands are imported: they would fail on it
        print(f"elsewhere: {unsupported}", file=sys.stderr)
        return exits.FAILED
    from . import commands

    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not [a for a in argv if a != "--debug"]:  # `elsewhere` alone: what it can do
        parser.print_help()
        return exits.OK
    args = parser.parse_args(argv)  # a usage error: one line, exit code 2
    if args.func is not commands.cmd_wait:
        from ..backends.peer import carry_on_here

        carry_on_here(False)  # a peer job's controller would end with this command
    return exits.run(args.func, args)
