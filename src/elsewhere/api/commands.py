"""The job verbs of the ``elsewhere`` command: what each does once its arguments are read.

Each ``cmd_*`` takes the parsed arguments and returns an exit code (``exits``); an error it
raises becomes one line and an exit code at the command line's boundary (``exits.run``). A
job is opened by name with :func:`open_job`, and its verb runs inside
``control.present``: a job purged meanwhile (by another process) is a JobGone, "no such
job", never a FileNotFoundError of one of its files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys
import time
from typing import Any

from ..core import control
from ..util.errors import JobError, JobGone, JobNotFound, TaskError
from . import exits, jsonout
from .terminal import console

__all__ = ["cmd_cancel", "cmd_demo", "cmd_doctor", "cmd_errors", "cmd_jobs", "cmd_logs", "cmd_purge",
           "cmd_results", "cmd_status", "cmd_template", "cmd_wait", "cmd_workers", "open_job"]  # fmt: skip


def open_job(name: str) -> Any:
    """The job of that name or id (``ew.recover``): JobNotFound if there is none, JobGone if it
    was purged while it was being opened, JobError if its job.json cannot be read."""
    from .functions import recover

    try:
        return recover(name)
    except JobGone:
        raise
    except JobNotFound as exc:
        from ..folder.registry import Registry

        if Registry().find(name):  # registered, its folder gone: that message says so
            raise
        raise JobNotFound(
            f"no job named {name!r}: `elsewhere jobs` lists the jobs there are"
        ) from exc
    except FileNotFoundError as exc:  # purged between the registry's answer and the reading
        raise JobGone(f"job {name!r} is gone: it was purged meanwhile; `elsewhere jobs` lists the jobs "
                      "there are") from exc  # fmt: skip
    except (ValueError, UnicodeDecodeError) as exc:
        raise JobError(f"job {name!r} cannot be opened: its job.json is damaged ({exc}); `elsewhere "
                       f"purge {name}` removes it") from exc  # fmt: skip


def cluster_object(text: Any) -> dict[str, Any] | None:
    """A registry row's cluster description (JSON text there) as an object; None if unreadable."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if text else None
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def cmd_jobs(args: argparse.Namespace) -> int:
    from .functions import jobs

    rows = [{**r, "cluster": cluster_object(r.get("cluster"))} for r in jobs()]
    if args.json:
        print(jsonout.dumps(rows))
        return exits.OK
    if not rows:
        print("no jobs (submit one with ew.submit, or try `elsewhere demo`)")
        return exits.OK
    from rich.markup import escape
    from rich.table import Table

    table = Table()
    for col in ("name", "state", "tasks", "counts", "where", "created"):
        table.add_column(col)
    for r in rows:
        kind = str((r["cluster"] or {}).get("kind", "?"))
        counts = ", ".join(f"{n} {s}" for s, n in r["counts"].items())
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"] or 0))
        cells = (r["name"], r["state"], r["n_tasks"], counts, kind, created)
        table.add_row(*(escape(str(c)) for c in cells))  # a name such as "fit[/x]" is not markup
    console().print(table)
    return exits.OK


def cmd_status(args: argparse.Namespace) -> int:
    job = open_job(args.name)
    with control.present(job.handle):
        st = job.check()
    if args.json:
        print(_status_json(job, st))
    else:
        print(st)
        for line in _reason_lines(st.reasons):
            print(line)
        if st.counts.get("failed"):
            print(
                f"  `elsewhere errors {_arg(args.name)}` shows what the failed tasks raised, and where"
            )
    return exits.OK


def _arg(text: str) -> str:
    """``text`` as one word of a shell command (a job's name in a hint)."""
    import shlex

    return shlex.quote(text)


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
    job = open_job(args.name)
    timeout = None if args.timeout is None or math.isinf(args.timeout) else args.timeout
    with control.present(job.handle):
        try:
            job.wait(timeout=timeout, progress=None if not args.no_progress else False)
        except JobError as exc:
            if isinstance(exc, JobGone) or job.path.is_dir():
                raise
            raise control.gone(job.handle) from exc  # "deleted while it was waited for"
        st = job.check()
    if args.json:
        print(_status_json(job, st))
    else:
        print(st)
    return exits.OK if st.state.value == "finished" else exits.FAILED


def _status_json(job: Any, st: Any) -> str:
    return jsonout.dumps({"name": job.name, "id": job.id, "state": st.state.value, "counts": st.counts,
                          "note": st.note, "reasons": {str(t): r for t, r in sorted(st.reasons.items())}},
                         indent=None)  # fmt: skip


def cmd_results(args: argparse.Namespace) -> int:
    job = open_job(args.name)
    with control.present(job.handle):
        try:
            values = job.results(partial=args.partial)
        except JobError as exc:
            if isinstance(exc, JobNotFound) or args.partial:
                raise
            counts = job.check().counts
            waiting = sum(counts.get(s, 0) for s in ("pending", "queued", "running"))
            if not waiting:
                raise
            name = _arg(args.name)
            raise JobError(f"job {job.name!r} has {waiting} of {job.n_tasks} tasks without a result yet: "
                           f"`elsewhere wait {name}` waits for them, `elsewhere results {name} --partial` "
                           "shows what there is") from exc  # fmt: skip
    if args.json:
        out = []
        for i, v in enumerate(values):
            if isinstance(v, TaskError):
                out.append({"task": i, "error": {"type": v.type_name, "message": v.message,
                                                   "reason": v.reason, "host": v.host}})  # fmt: skip
            else:
                out.append({"task": i, "value": v})
        print(jsonout.dumps(out, indent=None if args.compact else 2))
        return exits.OK
    from rich.markup import escape
    from rich.pretty import Pretty

    out = console()
    for i, v in enumerate(values):
        if isinstance(v, TaskError):
            out.print(f"[bold]{i}[/]: [red]{escape(v.type_name)}: {escape(v.message)}[/]")
        else:
            out.print(f"[bold]{i}[/]:", Pretty(v, max_length=20, max_string=400))
    if any(isinstance(v, TaskError) for v in values):
        out.print(
            f"(`elsewhere errors {escape(_arg(args.name))}` shows where they failed)",
            highlight=False,
        )
    return exits.OK


def cmd_logs(args: argparse.Namespace) -> int:
    job = open_job(args.name)
    with control.present(job.handle):
        n = job.n_tasks
        tasks = (
            [control.task_index(job.handle, args.task, n)] if args.task is not None else range(n)
        )
        if args.json:
            print(jsonout.dumps([{"task": i, "log": job.log(i)} for i in tasks], indent=None))
            return exits.OK
        for i in tasks:
            text = job.log(i)
            if args.task is None:
                if not text:
                    continue
                print(f"==> task {i} <==")
            sys.stdout.write(text)
            if text and not text.endswith("\n"):
                sys.stdout.write("\n")
    return exits.OK


def cmd_errors(args: argparse.Namespace) -> int:
    """What the failed tasks raised, each with the traceback from where it ran."""
    from ..util.states import TaskState

    job = open_job(args.name)
    with control.present(job.handle):
        job.check()  # the backend's latest word first (a lost worker becomes a failed task)
        tasks = job.tasks
        if args.task is not None:
            tasks = [tasks[control.task_index(job.handle, args.task, job.n_tasks)]]
        failed = [(t, t.result) for t in tasks if t.state is TaskState.FAILED]
        errors = [(t, e) for t, e in failed if isinstance(e, TaskError)]
    if args.json:
        print(jsonout.dumps([{"task": t.index, "type": e.type_name, "message": e.message, "reason": e.reason,
                              "host": e.host, "seed": e.seed, "traceback": e.traceback} for t, e in errors],
                            indent=None))  # fmt: skip
        return exits.OK
    if not errors:
        if args.task is not None:
            t = tasks[0]
            print(f"task {t.index} of job {job.name!r} has no error: it is {t.state.value}")
        else:
            print(f"job {job.name!r} has no failed task ({job.check()})")
        return exits.OK
    for k, (t, e) in enumerate(errors):
        if k:
            print()
        where = f" on {e.host}" if e.host else ""
        seed = f", seed {e.seed}" if e.seed is not None else ""
        what = e.type_name if e.reason == "error" else e.reason
        print(f"==> task {t.index} of job {job.name!r}: {what}{where}{seed} <==")
        text = e.traceback.rstrip("\n") if e.traceback else f"{e.type_name}: {e.message}"
        print(text)
    return exits.OK


def cmd_cancel(args: argparse.Namespace) -> int:
    job = open_job(args.name)
    job.cancel()  # JobGone if it was purged meanwhile
    try:
        with control.present(job.handle):
            print(job.check())
    except JobGone:
        print(f"cancelled job {job.name!r} ({job.id}); it has been purged since")
    return exits.OK


def cmd_purge(args: argparse.Namespace) -> int:
    try:
        job = open_job(args.name)
    except JobNotFound:
        # registry entries whose folder is gone help no one; best effort: "no such job" all the same
        with contextlib.suppress(Exception):
            _forget_vanished(args.name)
        raise
    except JobError as exc:
        # its job.json is damaged: its folder and registry entry go all the same
        return _purge_unreadable(args.name, exc)
    control.purge(job.cluster, job.handle)  # of several purges at once, one succeeds: JobGone
    print(f"purged job {job.name!r} ({job.id})")
    return exits.OK


def _forget_vanished(name: str) -> None:
    """Remove the registry entries of that name or id whose job folder is gone."""
    from pathlib import Path

    from ..folder.registry import Registry

    reg = Registry()
    for row in reg.find(name):
        if not Path(row["path"]).exists():
            reg.remove(row["id"])


def _purge_unreadable(name: str, why: JobError) -> int:
    """Remove the folder and registry entry of a job that cannot be opened (its cluster, unknown,
    is not asked to stop anything)."""
    from pathlib import Path

    from ..folder.lifecycle import remove_folder
    from ..folder.registry import Registry

    reg = Registry()
    rows = reg.find(name)
    if not rows:
        raise why
    row = rows[0]
    removed = remove_folder(Path(row["path"]))
    reg.remove(row["id"])
    if not removed:
        raise JobGone(f"job {name!r} is gone: it was purged meanwhile")
    print(f"purged job {name!r} ({row['id']}): its folder could not be read, so its cluster was not asked "
          "to stop its tasks")  # fmt: skip
    return exits.OK


def cmd_workers(args: argparse.Namespace) -> int:
    from ..backends.localworkers import stop_idle_workers
    from ..util import paths

    n = stop_idle_workers(paths.home())  # every pool: workers of `python` and `python3` alike
    print(f"asked {n} idle local worker(s) to exit")
    return exits.OK


_TEMPLATE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")


def cmd_template(args: argparse.Namespace) -> int:
    from ..schedulers import jobscripts
    from ..util.errors import ConfigError

    if args.action == "list":
        # one line per name: an installed template is used instead of the built-in one it shadows
        yours, builtin = jobscripts.user_names(), jobscripts.builtin_names()
        rows = [{"name": n, "source": "yours", "path": str(jobscripts.user_dir() / f"{n}.j2"),
                 "replaces_builtin": n in builtin} for n in yours]  # fmt: skip
        rows += [{"name": n, "source": "built in", "path": None, "replaces_builtin": False}
                 for n in builtin if n not in yours]  # fmt: skip
        rows.sort(key=lambda r: str(r["name"]))
        if args.json:
            print(jsonout.dumps(rows))
            return exits.OK
        for r in rows:
            if r["source"] == "yours":
                instead = ", used instead of the built-in one" if r["replaces_builtin"] else ""
                print(f"{r['name']}\t(yours, {r['path']}{instead})")
            else:
                print(f"{r['name']}\t(built in)")
        return exits.OK
    if not args.name:
        raise ConfigError(f"`elsewhere template {args.action}` needs a template name: "
                          "`elsewhere template list` lists them")  # fmt: skip
    for name in (args.name, args.source):
        if name is not None and not _TEMPLATE_NAME.fullmatch(name):
            raise ConfigError(f"{name!r} is not a template name: letters, digits, '.', '_' and '-' "
                              "(`elsewhere template list` lists them)")  # fmt: skip
    if args.action == "show":
        sys.stdout.write(jobscripts.find_template(args.name))
        return exits.OK
    if args.action == "install":
        path = jobscripts.install(args.name, source=args.source, force=args.force)
        print(f"installed {path}; edit it and use template={args.name!r}")
        return exits.OK
    import os
    import shlex
    import subprocess

    path = jobscripts.user_dir() / f"{args.name}.j2"
    if not path.exists():
        path = jobscripts.install(args.name, source=args.source)
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    return subprocess.call([*shlex.split(editor), str(path)])


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import diagnose, format_report

    checks = diagnose(args.target, python=args.python, remote_storage=args.remote_storage,
                      ssh_config=args.ssh_config, ssh_options=args.ssh_option or ())  # fmt: skip
    if args.json:
        print(
            jsonout.dumps(
                [{"name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix} for c in checks]
            )
        )
    else:
        print(format_report(checks, title=args.target))
    return exits.OK if all(c.ok for c in checks) else exits.FAILED


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run

    run(tasks=args.tasks, samples=args.samples)
    return exits.OK
