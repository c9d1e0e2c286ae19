"""The ``elsewhere`` command: the job verbs from a shell.

    elsewhere jobs                    the registry
    elsewhere status NAME             counts per state
    elsewhere wait NAME [--timeout S] block with a progress bar
    elsewhere results NAME [--json]   print the results
    elsewhere logs NAME [TASK]        captured output
    elsewhere cancel NAME             stop it
    elsewhere purge NAME              delete it
    elsewhere workers stop            stop the warm local workers
    elsewhere template list|show|install|edit [NAME]   job-script templates
    elsewhere doctor PROFILE_OR_HOST  check a profile or ssh host; say what to fix
    elsewhere peer worker|list|keygen the peer network
    elsewhere demo                    the main job of the README
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..util.errors import ElsewhereError


def _job(name: str) -> Any:
    from .functions import recover

    return recover(name)


def cmd_jobs(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .functions import jobs

    rows = jobs()
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    if not rows:
        print("no jobs (submit one with ew.submit, or try `elsewhere demo`)")
        return 0
    table = Table()
    for col in ("name", "state", "tasks", "counts", "where", "created"):
        table.add_column(col)
    for r in rows:
        kind = json.loads(r["cluster"]).get("kind", "?") if r["cluster"] else "?"
        counts = ", ".join(f"{n} {s}" for s, n in r["counts"].items())
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"] or 0))
        table.add_row(r["name"], str(r["state"]), str(r["n_tasks"]), counts, kind, created)
    Console().print(table)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    job = _job(args.name)
    st = job.check()
    if args.json:
        print(json.dumps({"name": job.name, "id": job.id, "state": st.state.value, "counts": st.counts,
                          "note": st.note, "reasons": {str(t): r for t, r in sorted(st.reasons.items())}}))
    else:
        print(st)
        for line in _reason_lines(st.reasons):
            print(line)
    return 0


def _reason_lines(reasons: dict[int, str], most: int = 10) -> list[str]:
    """What the backend says of single tasks, one line per reason with the tasks it holds for
    (``pending: Resources: tasks 3-9, 12``), the most common first."""
    by_reason: dict[str, list[int]] = {}
    for t, r in sorted(reasons.items()):
        by_reason.setdefault(r, []).append(t)
    out = []
    for r, tasks in sorted(by_reason.items(), key=lambda kv: -len(kv[1]))[:most]:
        out.append(f"  {r}: task{'s' if len(tasks) > 1 else ''} {_spans(tasks)}")
    if len(by_reason) > most:
        out.append(f"  ... and {len(by_reason) - most} more reasons (--json lists every task)")
    return out


def _spans(tasks: list[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"``."""
    parts: list[str] = []
    start = prev = tasks[0]
    for t in tasks[1:]:
        if t != prev + 1:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = t
        prev = t
    parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def cmd_wait(args: argparse.Namespace) -> int:
    job = _job(args.name)
    job.wait(timeout=args.timeout, progress=None if not args.no_progress else False)
    st = job.check()
    print(st)
    return 0 if st.state.value == "finished" else 1


def cmd_results(args: argparse.Namespace) -> int:
    from ..util.errors import TaskError

    job = _job(args.name)
    values = job.results(partial=args.partial)
    if args.json:
        out = []
        for i, v in enumerate(values):
            if isinstance(v, TaskError):
                out.append({"task": i, "error": {"type": v.type_name, "message": v.message,
                                                   "reason": v.reason, "host": v.host}})
            else:
                out.append({"task": i, "value": v})
        print(json.dumps(out, indent=None if args.compact else 2, default=_as_json))
        return 0
    from rich.console import Console
    from rich.pretty import Pretty

    console = Console()
    for i, v in enumerate(values):
        if isinstance(v, TaskError):
            console.print(f"[bold]{i}[/]: [red]{v.type_name}: {v.message}[/]")
        else:
            console.print(f"[bold]{i}[/]:", Pretty(v, max_length=20, max_string=400))
    return 0


def _as_json(value: Any) -> Any:
    """A value JSON has no type for: NumPy arrays and scalars as lists and numbers, a
    DataFrame as its records, a set as a list, anything else as its repr."""
    if hasattr(value, "to_dict") and hasattr(value, "columns"):  # a DataFrame
        return value.to_dict("records")
    if hasattr(value, "tolist") and callable(value.tolist):  # NumPy arrays and scalars
        converted = value.tolist()
        if not isinstance(converted, complex):
            return converted
    if isinstance(value, (set, frozenset)):
        return list(value)
    return repr(value)


def cmd_logs(args: argparse.Namespace) -> int:
    job = _job(args.name)
    tasks = [args.task] if args.task is not None else range(job.n_tasks)
    for i in tasks:
        text = job.log(i)
        if args.task is None:
            if not text:
                continue
            print(f"==> task {i} <==")
        sys.stdout.write(text)
        if text and not text.endswith("\n"):
            sys.stdout.write("\n")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    job = _job(args.name)
    job.cancel()
    print(job.check())
    return 0


def cmd_purge(args: argparse.Namespace) -> int:
    job = _job(args.name)
    job.purge()
    print(f"purged job {job.name!r} ({job.id})")
    return 0


def cmd_workers(args: argparse.Namespace) -> int:
    from ..backends.local import LocalCluster

    n = LocalCluster().shutdown()
    print(f"asked {n} idle local worker(s) to exit")
    return 0


def cmd_template(args: argparse.Namespace) -> int:
    from ..schedulers import jobscripts

    if args.action == "list":
        for n in jobscripts.user_names():
            print(f"{n}\t(yours, {jobscripts.user_dir() / (n + '.j2')})")
        for n in jobscripts.builtin_names():
            print(f"{n}\t(built in)")
        return 0
    if not args.name:
        raise SystemExit(f"elsewhere template {args.action}: give a template name")
    if args.action == "show":
        sys.stdout.write(jobscripts.find_template(args.name))
        return 0
    if args.action == "install":
        path = jobscripts.install(args.name, source=args.source, force=args.force)
        print(f"installed {path}; edit it and use template={args.name!r}")
        return 0
    if args.action == "edit":
        import os
        import subprocess

        path = jobscripts.user_dir() / f"{args.name}.j2"
        if not path.exists():
            path = jobscripts.install(args.name, source=args.source)
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        return subprocess.call([*editor.split(), str(path)])
    return 2


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import diagnose, format_report

    checks = diagnose(args.target, python=args.python, remote_storage=args.remote_storage,
                      ssh_config=args.ssh_config, ssh_options=args.ssh_option or ())
    print(format_report(checks, title=args.target))
    return 0 if all(c.ok for c in checks) else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run

    run(tasks=args.tasks, samples=args.samples)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from ..util.version import __version__

    p = argparse.ArgumentParser(prog="elsewhere", description="Run Python functions as tasks elsewhere.")
    p.add_argument("--version", action="version", version=f"elsewhere {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("jobs", help="list the jobs in the registry")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_jobs)

    s = sub.add_parser("status", help="counts of tasks per state")
    s.add_argument("name")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("wait", help="wait for a job to end (progress bar on a terminal)")
    s.add_argument("name")
    s.add_argument("--timeout", type=float, default=None, help="seconds")
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=cmd_wait)

    s = sub.add_parser("results", help="print a job's results")
    s.add_argument("name")
    s.add_argument("--json", action="store_true")
    s.add_argument("--compact", action="store_true", help="one line of JSON")
    s.add_argument("--partial", action="store_true", help="do not insist that every task is done")
    s.set_defaults(func=cmd_results)

    s = sub.add_parser("logs", help="captured stdout and stderr of a task (or of all)")
    s.add_argument("name")
    s.add_argument("task", nargs="?", type=int)
    s.set_defaults(func=cmd_logs)

    s = sub.add_parser("cancel", help="stop a job")
    s.add_argument("name")
    s.set_defaults(func=cmd_cancel)

    s = sub.add_parser("purge", help="delete a job and its folder")
    s.add_argument("name")
    s.set_defaults(func=cmd_purge)

    s = sub.add_parser("workers", help="manage warm local workers")
    s.add_argument("action", choices=["stop"])
    s.set_defaults(func=cmd_workers)

    s = sub.add_parser("template", help="job-script templates: list, show, install, edit")
    s.add_argument("action", choices=["list", "show", "install", "edit"])
    s.add_argument("name", nargs="?")
    s.add_argument("--source", help="the built-in template to start from (default: NAME)")
    s.add_argument("--force", action="store_true", help="overwrite an installed template")
    s.set_defaults(func=cmd_template)

    s = sub.add_parser("doctor", help="check that a profile or an ssh host can run tasks, and say what to fix")
    s.add_argument("target", metavar="PROFILE_OR_HOST", help="a profile name, 'local', or an ssh destination")
    s.add_argument("--python", help="the interpreter on the host (default: python3)")
    s.add_argument("--remote-storage", help="the job-copy folder on the host")
    s.add_argument("--ssh-config", help="an ssh config file to use instead of ~/.ssh/config")
    s.add_argument("-o", dest="ssh_option", action="append", metavar="KEY=VALUE",
                   help="an ssh option, as after ssh -o (repeatable)")
    s.set_defaults(func=cmd_doctor)

    from .peer_cli import add_peer_commands

    add_peer_commands(sub)

    s = sub.add_parser("demo", help="run the demo job: pi on local workers, with its speed-up")
    s.add_argument("--tasks", type=int, default=None)
    s.add_argument("--samples", type=int, default=1_500_000)
    s.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``elsewhere`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.func is not cmd_wait:
        from ..backends.peer import carry_on_here

        carry_on_here(False)  # a peer job's controller would end with this command
    try:
        return int(args.func(args) or 0)
    except ElsewhereError as exc:
        print(f"elsewhere: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error of ours.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("interrupted; the job goes on running (elsewhere cancel NAME stops it)", file=sys.stderr)
        return 130
