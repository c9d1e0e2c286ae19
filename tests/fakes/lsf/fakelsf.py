"""A fake LSF: bsub, bjobs, bhist, bkill, bqueues, bparams (stdlib only).

The commands in ``bin/`` call :func:`main`. They print what LSF 10.1 prints
for the options elsewhere uses (see tests/fakes/README.md); anything else
they refuse with LSF's usage error rather than guess.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import sys
import textwrap
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), ".."))

import fakecore

SCHED = "lsf"
OPTS_WITH_ARG = {
    "-J",
    "-o",
    "-e",
    "-oo",
    "-eo",
    "-n",
    "-R",
    "-W",
    "-q",
    "-P",
    "-sla",
    "-gpu",
    "-M",
    "-cwd",
    "-app",
    "-G",
    "-u",
    "-m",
    "-w",
    "-E",
    "-Ep",
    "-g",
    "-L",
    "-c",
    "-We",
}
FLAGS = {"-B", "-N", "-r", "-rn", "-H", "-x", "-K", "-I", "-Ip", "-Is", "-ti", "-hold"}
STAT = {
    "pending": "PEND",
    "running": "RUN",
    "done": "DONE",
    "failed": "EXIT",
    "cancelled": "EXIT",
    "timeout": "EXIT",
    "lost": "EXIT",
}
EXIT_REASONS = {
    "cancelled": "TERM_OWNER: job killed by owner",
    "timeout": "TERM_RUNLIMIT: job killed after reaching LSF run time limit",
    "lost": "TERM_HOST: job killed due to host failure",
}


def main(command: str, argv: list[str]) -> int:
    """Run fake ``command`` with ``argv``; the exit code."""
    handler = {
        "bsub": bsub,
        "bjobs": bjobs,
        "bhist": bhist,
        "bkill": bkill,
        "bqueues": bqueues,
        "bparams": bparams,
    }[command]
    return handler(argv)


# -- bsub -------------------------------------------------------------------------------


def _parse_opts(tokens: list[str], where: str) -> tuple[dict[str, str], list[str]]:
    opts: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in OPTS_WITH_ARG:
            if i + 1 >= len(tokens):
                raise SystemExit(_die(f"{tok}: option requires an argument ({where})"))
            opts[tok] = tokens[i + 1]
            i += 2
        elif tok in FLAGS:
            opts[tok] = ""
            i += 1
        elif tok.startswith("-") and tok != "-":
            raise SystemExit(_die(f"{tok}: Illegal option ({where})"))
        else:
            break
    return opts, tokens[i:]


def _die(message: str) -> int:
    print(f"bsub: {message}", file=sys.stderr)
    print("Usage: bsub [options] command [arguments]", file=sys.stderr)
    return 255


def _directives(script: str) -> list[str]:
    tokens: list[str] = []
    for line in script.splitlines()[1:]:
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#BSUB"):
            tokens += shlex.split(stripped[len("#BSUB") :])
        elif not stripped.startswith("#"):
            break  # LSF stops reading directives at the first command
    return tokens


def _walltime_s(text: str) -> float:
    text = text.split("/", 1)[0]
    hours, _, minutes = text.rpartition(":")
    return (int(hours or 0) * 60 + int(minutes)) * 60.0


def bsub(argv: list[str]) -> int:
    """``bsub [options] [command]``; with no command, the script comes on stdin."""
    opts, command = _parse_opts(argv, "command line")
    script = ""
    if not command:
        script = sys.stdin.read()
        if not script.strip():
            return _die("no command given and nothing on stdin")
        directive_opts, _ = _parse_opts(_directives(script), "script")
        directive_opts.update(opts)  # the command line wins
        opts = directive_opts
    name, indices, max_running, is_array = "", [0], None, False
    if "-J" in opts:
        m = re.fullmatch(r"(.*?)\[([0-9,:\-]+)\](?:%(\d+))?", opts["-J"])
        if m:
            name, is_array = m.group(1), True
            indices = fakecore.expand_idset(m.group(2))
            max_running = int(m.group(3)) if m.group(3) else None
            if not indices or min(indices) < 1:
                print("Bad job array index list. Job not submitted.", file=sys.stderr)
                return 255
        else:
            name = opts["-J"]
    queue_name = opts.get("-q", "normal")
    walltime = _walltime_s(opts["-W"]) if "-W" in opts else None
    with fakecore.locked(SCHED) as queue:
        number = str(fakecore.next_id(queue))
        if script:
            spool = os.path.join(fakecore.state_dir(), "lsf-spool")
            os.makedirs(spool, exist_ok=True)
            path = os.path.join(spool, f"{number}.sh")
            with open(path, "w") as fh:
                fh.write(script)
            run = ["/bin/bash", path]
            name = name or "#!/bin/bash"
        else:
            run = command
            name = name or command[0]

        def out_path(key: str, i: int) -> str:
            return opts[key].replace("%J", number).replace("%I", str(i))

        out_key = "-oo" if "-oo" in opts else "-o"
        err_key = "-eo" if "-eo" in opts else "-e"
        outputs = {i: out_path(out_key, i) if out_key in opts else os.devnull for i in indices}
        errors = {i: out_path(err_key, i) if err_key in opts else outputs[i] for i in indices}
        env = {"LSB_JOBID": number, "LSB_JOBNAME": name, "LSB_QUEUE": queue_name}
        element_env = {
            i: {
                "LSB_JOBINDEX": str(i if is_array else 0),
                "LSB_JOBNAME": f"{name}[{i}]" if is_array else name,
            }
            for i in indices
        }
        fakecore.new_job(
            queue,
            job_id=number,
            name=name,
            argv=run,
            indices=indices,
            outputs=outputs,
            errors=errors,
            env=env,
            element_env=element_env,
            cwd=opts.get("-cwd"),
            max_running=max_running,
            walltime_s=walltime,
            is_array=is_array,
            extra={
                "queue": queue_name,
                "project": opts.get("-P", "default"),
                "command": " ".join(run),
            },
        )
        fakecore.tick(SCHED, queue)
    where = f"queue <{queue_name}>" if "-q" in opts else f"default queue <{queue_name}>"
    print(f"Job <{number}> is submitted to {where}.")
    return 0


# -- selecting jobs -------------------------------------------------------------------------


def _select(
    queue: dict[str, Any], ids: list[str], *, finished_too: bool, history: bool = False
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], list[str]]:
    """(job, element) pairs for ``ids`` (all when empty), and the ids not found."""
    now = time.time()
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    missing: list[str] = []
    wanted = ids or [j["id"] for j in sorted(queue["jobs"].values(), key=lambda j: j["submitted"])]
    for spec in wanted:
        m = re.fullmatch(r"(\d+)(?:\[(\d+)\])?", spec)
        job = queue["jobs"].get(m.group(1)) if m else None
        if job is None or (m and m.group(2) and m.group(2) not in job["elements"]):
            missing.append(spec)
            continue
        found = False
        for key in sorted(job["elements"], key=int):
            el = job["elements"][key]
            if m and m.group(2) and key != m.group(2):
                continue
            if not history:
                if not fakecore.visible(el, now):
                    continue
                if el["state"] in fakecore.TERMINAL and not finished_too:
                    found = True  # known, but bjobs without -a hides it
                    continue
            pairs.append((job, el))
            found = True
        if not found:
            missing.append(spec)
    return pairs, missing


def _native_id(job: dict[str, Any], el: dict[str, Any]) -> str:
    return f"{job['id']}[{el['index']}]" if job["is_array"] else job["id"]


def _field(job: dict[str, Any], el: dict[str, Any], name: str) -> str:
    state = el["state"]
    stat = STAT[state]
    if name == "jobid":
        return job["id"]
    if name == "jobindex":
        return str(el["index"]) if job["is_array"] else "0"
    if name == "stat":
        return stat
    if name == "exit_code":
        return str(el["exit_code"]) if stat == "EXIT" and el["exit_code"] is not None else "-"
    if name == "exit_reason":
        return EXIT_REASONS.get(state, "-") if stat == "EXIT" else "-"
    if name == "pend_reason":
        if state != "pending":
            return "-"
        if job["max_running"]:
            return "The job array has reached its limit of running elements"
        return "Job's resource requirements not satisfied"
    if name in ("job_name", "name"):
        return f"{job['name']}[{el['index']}]" if job["is_array"] else job["name"]
    if name == "user":
        return job["user"]
    if name == "queue":
        return job["extra"].get("queue", "normal")
    if name == "from_host":
        return socket.gethostname()
    if name == "exec_host":
        return socket.gethostname() if el["start"] else "-"
    if name == "submit_time":
        return time.strftime("%b %e %H:%M", time.localtime(el["submitted"]))
    raise SystemExit(_bjobs_die(f"{name}: Illegal field name"))


def _bjobs_die(message: str) -> int:
    print(message, file=sys.stderr)
    return 255


# -- bjobs ------------------------------------------------------------------------------------


def bjobs(argv: list[str]) -> int:
    """``bjobs [-a] [-d] [-noheader] [-w] [-o "fields delimiter='c'"] [ids]``."""
    all_jobs = done_only = noheader = False
    fmt = ""
    ids: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "-a":
            all_jobs = True
        elif tok == "-d":
            done_only = True
        elif tok == "-noheader":
            noheader = True
        elif tok in ("-w", "-l"):
            pass
        elif tok in ("-o", "-u", "-q", "-J"):
            if tok == "-o":
                fmt = argv[i + 1]
            i += 1
        elif tok.startswith("-"):
            print(f"{tok}: Illegal option", file=sys.stderr)
            return 255
        else:
            ids.append(tok)
        i += 1
    queue = fakecore.read(SCHED)
    pairs, missing = _select(queue, ids, finished_too=all_jobs or done_only)
    if done_only:
        pairs = [(j, e) for j, e in pairs if e["state"] in fakecore.TERMINAL]
    lines: list[str] = []
    if fmt:
        m = re.search(r"\s*delimiter=['\"](.)['\"]\s*$", fmt)
        delim = m.group(1) if m else " "
        names = [f.split(":", 1)[0].lower() for f in (fmt[: m.start()] if m else fmt).split()]
        if not noheader:
            lines.append(delim.join(n.upper() for n in names))
        lines += [delim.join(_field(j, e, n) for n in names) for j, e in pairs]
    else:
        cols = (
            "jobid",
            "user",
            "stat",
            "queue",
            "from_host",
            "exec_host",
            "job_name",
            "submit_time",
        )
        widths = (8, 8, 6, 11, 12, 12, 11, 12)
        if not noheader:
            lines.append(
                "".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()
            )
        for j, e in pairs:
            shown = {**{c: _field(j, e, c) for c in cols}}
            if j["is_array"]:
                shown["jobid"] = j["id"]
            lines.append(
                "".join(shown[c].ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()
            )
    body = lines[1:] if (lines and not noheader) else lines
    if body:
        print("\n".join(lines))
    for spec in missing:
        print(f"Job <{spec}> is not found", file=sys.stderr)
    if not body and not missing:
        print("No unfinished job found" if not all_jobs else "No job found", file=sys.stderr)
    return 255 if missing else 0


# -- bhist ----------------------------------------------------------------------------------------


def _stamp(t: float) -> str:
    return time.strftime("%a %b %e %H:%M:%S", time.localtime(t))


def _wrap(line: str) -> str:
    # bhist -l wraps at 80 columns; continuation lines are indented by 21 spaces
    if len(line) <= 80:
        return line
    first, rest = line[:80], line[80:]
    more = textwrap.wrap(
        rest, 59, break_long_words=True, break_on_hyphens=False, drop_whitespace=False
    )
    return "\n".join([first, *(" " * 21 + chunk for chunk in more)])


def bhist(argv: list[str]) -> int:
    """``bhist -l [-a] [-n N] [ids]``: the long event history of each element."""
    ids: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in ("-n", "-u", "-J", "-q"):
            i += 1
        elif tok.startswith("-"):
            if tok not in ("-l", "-a", "-d", "-p", "-r", "-s", "-w"):
                print(f"{tok}: Illegal option", file=sys.stderr)
                return 255
        else:
            ids.append(tok)
        i += 1
    queue = fakecore.read(SCHED)
    pairs, missing = _select(queue, ids, finished_too=True, history=True)
    host = socket.gethostname()
    records: list[str] = []
    for job, el in pairs:
        nid = _native_id(job, el)
        name = _field(job, el, "job_name")
        lines = [
            f"Job <{nid}>, Job Name <{name}>, User <{job['user']}>, Project <{job['extra'].get('project', 'default')}>,"
            f" Command <{job['extra'].get('command', '')}>",
            f"{_stamp(el['submitted'])}: Submitted from host <{host}>, to Queue <{job['extra'].get('queue', 'normal')}>,"
            f" CWD <{job['cwd']}>;",
        ]
        if el["start"]:
            lines += [
                f"{_stamp(el['start'])}: Dispatched to <{host}>, Effective RES_REQ <select[type == local] order[r15s:pg] >;",
                f"{_stamp(el['start'])}: Starting (Pid {el['pid']});",
            ]
        state, end = el["state"], el["end"] or time.time()
        if state == "cancelled":
            lines.append(
                f"{_stamp(end)}: Signal <KILL> requested by user or administrator <{job['user']}>;"
            )
        if state == "done":
            lines += [
                f"{_stamp(end)}: Done successfully. The CPU time used is 0.1 seconds;",
                f"{_stamp(end)}: Post job process done successfully;",
            ]
        elif state in ("failed", "cancelled", "timeout", "lost"):
            if el["start"] and el["exit_code"] is not None:
                lines.append(
                    f"{_stamp(end)}: Exited with exit code {el['exit_code']}. The CPU time used is 0.1 seconds;"
                )
            else:
                lines.append(f"{_stamp(end)}: Exited; job has been forced to exit;")
            reason = EXIT_REASONS.get(state)
            lines.append(f"{_stamp(end)}: Completed <exit>" + (f"; {reason}." if reason else "."))
        run_s = int((el["end"] or time.time()) - el["start"]) if el["start"] else 0
        pend_s = int((el["start"] or time.time()) - el["submitted"])
        lines += [
            "",
            "Summary of time in seconds spent in various states by  " + _stamp(end),
            "  PEND     PSUSP    RUN      USUSP    SSUSP    UNKWN    TOTAL",
            f"  {pend_s:<9d}0        {run_s:<9d}0        0        0        {pend_s + run_s}",
        ]
        records.append("\n".join(_wrap(ln) for ln in lines))
    if records:
        print(("\n" + "-" * 78 + "\n\n").join(records))
    for spec in missing:
        print(f"{spec}: No matching job found", file=sys.stderr)
    return 255 if missing and not records else 0


# -- bkill -------------------------------------------------------------------------------------------


def bkill(argv: list[str]) -> int:
    """``bkill ids``: every unfinished element of a job, or one element ``N[i]``."""
    ids = [a for a in argv if not a.startswith("-")]
    if not ids:
        print("bkill: Job ID or one of '-m', '-u' and '-J' must be specified", file=sys.stderr)
        return 255
    rc = 0
    with fakecore.locked(SCHED) as queue:
        for spec in ids:
            m = re.fullmatch(r"(\d+)(?:\[(\d+)\])?", spec)
            job = queue["jobs"].get(m.group(1)) if m else None
            elements = []
            if job is not None and m:
                elements = [
                    e for k, e in job["elements"].items() if not m.group(2) or k == m.group(2)
                ]
            if not elements:
                print(f"Job <{spec}>: No matching job found", file=sys.stderr)
                rc = 255
                continue
            killed = [fakecore.cancel_element(e) for e in elements]
            if any(killed):
                print(f"Job <{spec}> is being terminated")
            else:
                print(f"Job <{spec}>: Job has already finished", file=sys.stderr)
                rc = 255
        fakecore.tick(SCHED, queue)
    return rc


# -- bqueues, bparams --------------------------------------------------------------------------------


def bqueues(argv: list[str]) -> int:
    """``bqueues [queue]``: one open, active queue, ``normal`` (and any asked for)."""
    names = [a for a in argv if not a.startswith("-")] or ["normal"]
    queue = fakecore.read(SCHED)
    print("QUEUE_NAME      PRIO STATUS          MAX JL/U JL/P JL/H NJOBS  PEND   RUN  SUSP")
    for name in names:
        els = [
            e
            for j in queue["jobs"].values()
            if j["extra"].get("queue", "normal") == name
            for e in j["elements"].values()
        ]
        pend = sum(e["state"] == "pending" for e in els)
        run = sum(e["state"] == "running" for e in els)
        print(
            f"{name:<15} {30:>4} {'Open:Active':<15} {'-':>4} {'-':>4} {'-':>4} {'-':>4} {pend + run:>5} {pend:>5} {run:>5} {0:>5}"
        )
    return 0


def bparams(argv: list[str]) -> int:
    """``bparams -l``: the parameters elsewhere reads."""
    size = os.environ.get("ELSEWHERE_FAKE_MAX_ARRAY_SIZE", "1000")
    print("System default queues for automatic queue selection:")
    print("    DEFAULT_QUEUE = normal")
    print("")
    print("The maximum number of jobs in a job array:")
    print(f"    MAX_JOB_ARRAY_SIZE = {size}")
    print("")
    print("The interval for cleaning up finished jobs:")
    print(f"    CLEAN_PERIOD = {int(fakecore.keep_s())} (seconds)")
    return 0
