"""A fake HTCondor: condor_submit, condor_q, condor_history, condor_rm, condor_config_val.

Stdlib only. The submit description language is read as far as elsewhere's
template and simple hand-written files use it: ``key = value`` commands,
``+Attr = expr`` / ``MY.Attr = expr`` custom attributes, the macros
``$(Cluster)``, ``$(ClusterId)``, ``$(Process)``, ``$(ProcId)``, ``-a``
commands, and one ``queue [N]`` statement.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), ".."))

import fakecore

SCHED = "htcondor"
JOB_STATUS = {
    "pending": 1,
    "running": 2,
    "cancelled": 3,
    "done": 4,
    "failed": 4,
    "timeout": 3,
    "lost": 4,
}


def main(command: str, argv: list[str]) -> int:
    """Run fake ``command`` with ``argv``; the exit code."""
    handler = {
        "condor_submit": condor_submit,
        "condor_q": condor_q,
        "condor_history": condor_history,
        "condor_rm": condor_rm,
        "condor_config_val": condor_config_val,
    }[command]
    return handler(argv)


# -- condor_submit --------------------------------------------------------------------------


def _expand(value: str, cluster: int, proc: int) -> str:
    for name, number in (
        ("ClusterId", cluster),
        ("Cluster", cluster),
        ("ProcId", proc),
        ("Process", proc),
    ):
        value = value.replace(f"$({name})", str(number))
    return value


def _evaluate(expr: str) -> Any:
    """Integers and + - of integers, quoted strings, true/false; anything else stays text."""
    text = expr.strip()
    if re.fullmatch(r"-?\d+(\s*[+-]\s*\d+)*", text):
        total, sign = 0, 1
        for token in re.findall(r"[+-]|\d+", text):
            if token in "+-":
                sign = 1 if token == "+" else -1
            else:
                total += sign * int(token)
                sign = 1
        return total
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def condor_submit(argv: list[str]) -> int:
    """``condor_submit [-a cmd]... [-terse] [file]`` (stdin when no file)."""
    appended: list[str] = []
    terse = False
    files: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in ("-a", "-append"):
            appended.append(argv[i + 1])
            i += 2
            continue
        if tok == "-terse":
            terse = True
        elif tok in ("-batch-name", "-queue"):
            appended.append(("batch_name = " if tok == "-batch-name" else "queue ") + argv[i + 1])
            i += 2
            continue
        elif tok.startswith("-"):
            print(f"ERROR: unknown option {tok}", file=sys.stderr)
            return 1
        else:
            files.append(tok)
        i += 1
    if files:
        with open(files[0]) as fh:
            text = fh.read()
    else:
        text = sys.stdin.read()
    commands: dict[str, str] = {}
    attrs: dict[str, str] = {}
    count: int | None = None
    lines = [ln.strip() for ln in text.splitlines()]
    queue_at = next((n for n, ln in enumerate(lines) if re.match(r"^queue\b", ln, re.I)), None)
    if queue_at is None:
        if not any(re.match(r"^queue\b", a, re.I) for a in appended):
            print("ERROR: no 'queue' statement in the submit description", file=sys.stderr)
            return 1
        lines += appended
    else:
        lines = (
            lines[:queue_at]
            + [a for a in appended if not a.lower().startswith("queue")]
            + lines[queue_at:]
        )
    for line in lines:
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^queue\b\s*(\d*)\s*$", line, re.I)
        if m:
            count = int(m.group(1) or 1)
            break
        if re.match(r"^queue\b", line, re.I):
            print(f"ERROR: unsupported queue statement: {line}", file=sys.stderr)
            return 1
        key, sep, value = line.partition("=")
        if not sep:
            print(f"ERROR: Parse error in submit file: {line}", file=sys.stderr)
            return 1
        key, value = key.strip(), value.strip()
        if key.startswith("+"):
            attrs[key[1:]] = value
        elif key.upper().startswith("MY."):
            attrs[key[3:]] = value
        else:
            commands[key.lower()] = value
    if count is None:
        print("ERROR: no 'queue' statement in the submit description", file=sys.stderr)
        return 1
    executable = commands.get("executable")
    if not executable:
        print("ERROR: Executable not specified", file=sys.stderr)
        return 1
    cwd = commands.get("initialdir", os.getcwd())
    executable = executable if os.path.isabs(executable) else os.path.join(cwd, executable)
    if not os.access(executable, os.X_OK) and not os.path.exists(executable):
        print(f"ERROR: Executable file {executable} does not exist", file=sys.stderr)
        return 1
    walltime = None
    m = re.search(r"EnteredCurrentStatus\s*\)?\s*>\s*(\d+)", commands.get("periodic_remove", ""))
    if m:
        walltime = float(m.group(1))
    max_running = int(commands["max_materialize"]) if "max_materialize" in commands else None
    with fakecore.locked(SCHED) as queue:
        cluster = fakecore.next_id(queue)
        procs = list(range(count))

        def path(key: str, proc: int) -> str:
            value = commands.get(key)
            if not value:
                return os.devnull
            value = _expand(value, cluster, proc)
            return value if os.path.isabs(value) else os.path.join(cwd, value)

        arguments = commands.get("arguments", "").strip('"')
        job = fakecore.new_job(
            queue,
            job_id=str(cluster),
            name=commands.get("batch_name", ""),
            argv=[executable],
            indices=procs,
            outputs={p: path("output", p) for p in procs},
            errors={p: path("error", p) for p in procs},
            cwd=cwd,
            max_running=max_running,
            walltime_s=walltime,
            extra={
                "attrs": {
                    p: {k: _evaluate(_expand(v, cluster, p)) for k, v in attrs.items()}
                    for p in procs
                },
                "periodic_remove": commands.get("periodic_remove", ""),
            },
        )
        # HTCondor makes a transferred executable executable; run a script that
        # lacks the x bit through its #! interpreter, as that amounts to the same
        launcher = [executable]
        if not os.access(executable, os.X_OK):
            with open(executable, "rb") as fh:
                first = fh.readline().decode(errors="replace")
            if first.startswith("#!"):
                launcher = [*shlex.split(first[2:].strip()), executable]
        for p in procs:
            job["elements"][str(p)]["argv"] = [
                *launcher,
                *shlex.split(_expand(arguments, cluster, p)),
            ]
        fakecore.tick(SCHED, queue)
    if terse:
        print(f"{cluster}.0 - {cluster}.{count - 1}")
    else:
        print("Submitting job(s)" + "." * count)
        print(f"{count} job(s) submitted to cluster {cluster}.")
    return 0


# -- reading the queue ---------------------------------------------------------------------------


def _ads(queue: dict[str, Any], *, history: bool) -> list[dict[str, Any]]:
    """Job ads in the queue (history False), or every finished one (history True).

    A finished job stays in the queue view for ELSEWHERE_FAKE_KEEP_S seconds
    (as with leave_in_queue); history lists every finished job, newest first.
    """
    now = time.time()
    ads: list[dict[str, Any]] = []
    for job in sorted(queue["jobs"].values(), key=lambda j: j["submitted"]):
        for key in sorted(job["elements"], key=int):
            el = job["elements"][key]
            keep = el["state"] in fakecore.TERMINAL if history else fakecore.visible(el, now)
            if keep:
                ads.append(_ad(job, el))
    if history:
        ads.reverse()
    return ads


def _ad(job: dict[str, Any], el: dict[str, Any]) -> dict[str, Any]:
    state = el["state"]
    ad: dict[str, Any] = {
        "ClusterId": int(job["id"]),
        "ProcId": el["index"],
        "JobStatus": JOB_STATUS[state],
        "Owner": job["user"],
        "JobBatchName": job["name"] or None,
        "Cmd": job["argv"][0],
        "QDate": int(el["submitted"]),
        "EnteredCurrentStatus": int(el["end"] or el["start"] or el["submitted"]),
    }
    ad.update(job["extra"]["attrs"].get(str(el["index"]), {}))
    if state in ("done", "failed"):
        if el["signal"]:
            ad.update(ExitBySignal=True, ExitSignal=el["signal"])
        else:
            ad.update(ExitBySignal=False, ExitCode=el["exit_code"])
    if state == "lost":
        # its processes were killed on the execute node (the fake stands in for a
        # node failure this way; a real schedd would usually run the job again)
        ad.update(ExitBySignal=True, ExitSignal=9)
    if state == "cancelled":
        ad["RemoveReason"] = f"via condor_rm (by user {job['user']})"
    if state == "timeout":
        expr = job["extra"].get("periodic_remove", "")
        ad["RemoveReason"] = (
            f"The job attribute PeriodicRemove expression '{expr}' evaluated to TRUE"
        )
    return ad


def _format(value: Any) -> str:
    if value is None:
        return "undefined"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _select(ads: list[dict[str, Any]], ids: list[str], constraint: str) -> list[dict[str, Any]]:
    if ids:
        wanted = []
        for spec in ids:
            cluster, _, proc = spec.partition(".")
            wanted += [
                a
                for a in ads
                if str(a["ClusterId"]) == cluster and (not proc or str(a["ProcId"]) == proc)
            ]
        ads = wanted
    if constraint:
        clusters = set(re.findall(r"ClusterId\s*==\s*(\d+)", constraint))
        if not clusters and constraint.strip().lower() != "true":
            print(f"Error: unsupported constraint: {constraint}", file=sys.stderr)
            raise SystemExit(1)
        if clusters:
            ads = [a for a in ads if str(a["ClusterId"]) in clusters]
    return ads


def _query(argv: list[str], *, history: bool) -> int:
    ids: list[str] = []
    attrs: list[str] = []
    delim = " "
    constraint = ""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("-af") or tok.startswith("-autoformat"):
            flags = tok.partition(":")[2]
            delim = "\t" if "t" in flags else ("," if "," in flags else " ")
            attrs = [a for a in argv[i + 1 :] if not a.startswith("-")]
            i += 1 + len(attrs)
            continue
        if tok in ("-constraint", "-const"):
            constraint = argv[i + 1]
            i += 2
            continue
        if tok in ("-limit", "-match"):
            i += 2
            continue
        if tok in ("-allusers", "-nobatch", "-forwards"):
            i += 1
            continue
        if tok.startswith("-"):
            print(f"Error: unknown option {tok}", file=sys.stderr)
            return 1
        ids.append(tok)
        i += 1
    queue = fakecore.read(SCHED)
    ads = _select(_ads(queue, history=history), ids, constraint)
    if attrs:
        for ad in ads:
            print(delim.join(_format(ad.get(a)) for a in attrs))
        return 0
    if history:
        print(" ID     OWNER          SUBMITTED   RUN_TIME     ST  COMPLETED   CMD")
        for ad in ads:
            st = {3: "X", 4: "C"}.get(ad["JobStatus"], "?")
            print(
                f" {ad['ClusterId']}.{ad['ProcId']:<5} {ad['Owner']:<14} {'':11} {'0+00:00:00':12} {st:3} {'':11} {ad['Cmd']}"
            )
        return 0
    print("")
    print("-- Schedd: fake@localhost : <127.0.0.1:9618>")
    print(" ID      OWNER            SUBMITTED     RUN_TIME ST PRI SIZE CMD")
    letters = {1: "I", 2: "R", 3: "X", 4: "C", 5: "H", 6: ">", 7: "S"}
    for ad in ads:
        print(
            f"{ad['ClusterId']:>4}.{ad['ProcId']:<3} {ad['Owner']:<16} {'':13} 0+00:00:00 {letters[ad['JobStatus']]}  0    0.0 {ad['Cmd']}"
        )
    counts = {n: sum(1 for a in ads if a["JobStatus"] == n) for n in letters}
    print("")
    print(
        f"Total for query: {len(ads)} jobs; {counts[4]} completed, {counts[3]} removed, {counts[1]} idle, "
        f"{counts[2]} running, {counts[5]} held, {counts[7]} suspended"
    )
    return 0


def condor_q(argv: list[str]) -> int:
    """``condor_q [ids] [-af[:t] attrs...]``: jobs in the queue."""
    return _query(argv, history=False)


def condor_history(argv: list[str]) -> int:
    """``condor_history [ids] [-constraint expr] [-af[:t] attrs...]``: jobs that left the queue."""
    return _query(argv, history=True)


# -- condor_rm, condor_config_val -----------------------------------------------------------------


def condor_rm(argv: list[str]) -> int:
    """``condor_rm ids``: remove a cluster or a cluster.proc."""
    ids = [a for a in argv if not a.startswith("-")]
    rc = 0
    with fakecore.locked(SCHED) as queue:
        for spec in ids:
            cluster, _, proc = spec.partition(".")
            job = queue["jobs"].get(cluster)
            elements = []
            if job is not None:
                elements = [e for k, e in job["elements"].items() if not proc or k == proc]
            removed = [fakecore.cancel_element(e, "removed") for e in elements]
            if proc:
                if any(removed):
                    print(f"Job {spec} marked for removal")
                else:
                    print(f"Job {spec} not found", file=sys.stderr)
                    rc = 1
            elif any(removed):
                print(f"All jobs in cluster {cluster} have been marked for removal")
            else:
                print(f"Couldn't find/remove all jobs in cluster {cluster}", file=sys.stderr)
                rc = 1
        fakecore.tick(SCHED, queue)
    return rc


def condor_config_val(argv: list[str]) -> int:
    """``condor_config_val NAME``: the one knob elsewhere asks about."""
    values = {"MAX_JOBS_PER_SUBMISSION": os.environ.get("ELSEWHERE_FAKE_MAX_ARRAY_SIZE", "20000")}
    rc = 0
    for name in (a for a in argv if not a.startswith("-")):
        if name.upper() in values:
            print(values[name.upper()])
        else:
            print(f"Not defined: {name}", file=sys.stderr)
            rc = 1
    return rc
