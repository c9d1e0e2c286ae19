"""A fake Flux command: ``flux submit|batch|run|jobs|cancel|job info`` (stdlib only).

Every Flux job is one element of the shared fake queue (``fakecore``); ``flux
submit --cc=IDSET`` makes one job per id, with ``FLUX_JOB_CC`` set. Job ids
grow with time like Flux's FLUIDs and are printed in F58 (``ƒ...``, or
``f...`` when stdout cannot encode ``ƒ``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import string
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), ".."))

import fakecore

SCHED = "flux"
ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
EPOCH_MS = 1_577_836_800_000  # 2020-01-01, like a FLUID's timestamp base


def f58(value: int) -> str:
    """The F58 form of ``value``, with the prefix stdout can print."""
    digits = ""
    while True:
        value, rest = divmod(value, 58)
        digits = ALPHABET[rest] + digits
        if value == 0:
            break
    prefix = "ƒ"
    try:
        prefix.encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        prefix = "f"
    return prefix + digits


def parse_id(text: str) -> int | None:
    """A job id in F58, decimal or hex; None when it is none of these."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    if text.startswith("0x"):
        try:
            return int(text, 16)
        except ValueError:
            return None
    for prefix in ("ƒ", "f"):
        if text.startswith(prefix) and len(text) > len(prefix):
            value = 0
            for ch in text[len(prefix) :]:
                digit = ALPHABET.find(ch)
                if digit < 0:
                    return None
                value = value * 58 + digit
            return value
    return None


def fsd_seconds(text: str) -> float:
    """Flux standard duration: ``30s``, ``5m``, ``2h``, ``1d``, ``1.5h``; a bare number is minutes."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?", text.strip())
    if not m:
        raise ValueError(f"invalid Flux standard duration '{text}'")
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 60}[m.group(2)]
    return float(m.group(1)) * unit


def main(argv: list[str]) -> int:
    """``flux SUBCOMMAND ...``; the exit code."""
    if not argv:
        print("usage: flux [OPTIONS] COMMAND ARGS", file=sys.stderr)
        return 1
    cmd, rest = argv[0], argv[1:]
    if cmd == "job" and rest[:1] == ["info"]:
        return job_info(rest[1:])
    if cmd == "job" and rest[:1] == ["cancel"]:
        return cancel(rest[1:])
    handlers = {"submit": submit, "batch": batch, "run": run, "jobs": jobs, "cancel": cancel}
    if cmd not in handlers:
        print(
            f"flux: '{cmd}' is not a flux command (fake: {', '.join(handlers)}, job info)",
            file=sys.stderr,
        )
        return 1
    return handlers[cmd](rest)


# -- submission --------------------------------------------------------------------------


def _parser(prog: str, batch_mode: bool) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    p.add_argument("-q", "--queue")
    p.add_argument("-t", "--time-limit")
    p.add_argument("--job-name")
    p.add_argument("--urgency", default="16")
    p.add_argument("-o", "--setopt", action="append", default=[])
    p.add_argument("--setattr", action="append", default=[])
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--output")
    p.add_argument("--error")
    p.add_argument("--cwd")
    p.add_argument("--dependency", action="append", default=[])
    p.add_argument("-N", "--nodes", type=int)
    p.add_argument("-x", "--exclusive", action="store_true")
    p.add_argument("-v", "--verbose", action="count", default=0)
    if batch_mode:
        p.add_argument("-n", "--nslots", type=int)
        p.add_argument("-c", "--cores-per-slot", type=int, default=1)
        p.add_argument("-g", "--gpus-per-slot", type=int)
    else:
        p.add_argument("-n", "--ntasks", type=int, default=1)
        p.add_argument("-c", "--cores-per-task", type=int, default=1)
        p.add_argument("-g", "--gpus-per-task", type=int)
        p.add_argument("--cc")
        p.add_argument("--bcc")
        p.add_argument("--quiet", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def _new_id(queue: dict[str, Any]) -> int:
    now_ms = int(time.time() * 1000) - EPOCH_MS
    last = int(queue.get("last_fluid", 0))
    value = max(last + 1, now_ms << 24)
    queue["last_fluid"] = value
    return value


def _substitute(template: str, job_id: int, name: str, cc: int | None) -> str:
    text = template.replace("{{", "\0").replace("}}", "\1")
    if cc is not None:
        text = text.replace("{cc}", str(cc))
    text = text.replace("\0", "{{").replace("\1", "}}")
    for tag, value in (
        ("{{id.dec}}", str(job_id)),
        ("{{id.f58}}", f58(job_id)),
        ("{{id.hex}}", f"0x{job_id:x}"),
        ("{{id}}", f58(job_id)),
        ("{{jobid}}", f58(job_id)),
        ("{{name}}", name),
    ):
        text = text.replace(tag, value)
    return text


def _env(rules: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for rule in rules:
        key, sep, value = rule.partition("=")
        if sep and not key.startswith(("-", "^")):
            env[key] = value
    return env


def _submit_jobs(
    args: argparse.Namespace, command: list[str], copies: list[int | None], batch_mode: bool
) -> int:
    walltime = fsd_seconds(args.time_limit) if args.time_limit else None
    ids: list[int] = []
    with fakecore.locked(SCHED) as queue:
        for cc in copies:
            job_id = _new_id(queue)
            name = args.job_name or os.path.basename(command[0])
            if args.output:
                output = _substitute(args.output, job_id, name, cc)
            elif batch_mode:
                output = f"flux-{f58(job_id)}.out"
            else:
                kvs = os.path.join(fakecore.state_dir(), "flux-kvs")
                os.makedirs(kvs, exist_ok=True)
                output = os.path.join(kvs, f"{job_id}.out")
            cwd = args.cwd or os.getcwd()
            if not os.path.isabs(output):
                output = os.path.join(cwd, output)
            error = _substitute(args.error, job_id, name, cc) if args.error else output
            env = {"FLUX_JOB_ID": f58(job_id), "FLUX_TASK_RANK": "0", "FLUX_JOB_SIZE": "1"}
            if cc is not None and args.cc:
                env["FLUX_JOB_CC"] = str(cc)
            env.update(_env(args.env))
            argv = [c.replace("{cc}", str(cc)) if cc is not None else c for c in command]
            fakecore.new_job(
                queue,
                job_id=str(job_id),
                name=name,
                argv=argv,
                indices=[0],
                outputs={0: output},
                errors={0: error},
                env=env,
                cwd=cwd,
                walltime_s=walltime,
                is_array=False,
                extra={
                    "cc": cc,
                    "ntasks": getattr(args, "ntasks", None) or getattr(args, "nslots", None) or 1,
                    "queue": args.queue or "",
                    "urgency": args.urgency,
                },
            )
            ids.append(job_id)
        fakecore.tick(SCHED, queue)
    if not getattr(args, "quiet", False):
        for job_id in ids:
            print(f58(job_id))
    return 0


def submit(argv: list[str]) -> int:
    """``flux submit [--cc=IDSET] [options] COMMAND...``."""
    args = _parser("flux-submit", batch_mode=False).parse_args(argv)
    if not args.command:
        print("flux-submit: ERROR: job command and arguments are missing", file=sys.stderr)
        return 1
    spec = args.cc or args.bcc
    try:
        copies: list[int | None] = list(fakecore.expand_idset(spec)) if spec else [None]
        if args.time_limit:
            fsd_seconds(args.time_limit)
    except ValueError as exc:
        print(f"flux-submit: ERROR: {exc}", file=sys.stderr)
        return 1
    return _submit_jobs(args, args.command, copies, batch_mode=False)


def batch(argv: list[str]) -> int:
    """``flux batch [options] SCRIPT [ARGS]``: the script is copied at submission."""
    args = _parser("flux-batch", batch_mode=True).parse_args(argv)
    if not args.command:
        print("flux-batch: ERROR: batch script is required", file=sys.stderr)
        return 1
    script = args.command[0]
    spool = os.path.join(fakecore.state_dir(), "flux-spool")
    os.makedirs(spool, exist_ok=True)
    copy = os.path.join(spool, f"{time.time_ns()}-{os.path.basename(script)}")
    try:
        shutil.copyfile(script, copy)
    except OSError as exc:
        print(f"flux-batch: ERROR: {exc}", file=sys.stderr)
        return 1
    args.job_name = args.job_name or os.path.basename(script)
    return _submit_jobs(args, ["/bin/sh", copy, *args.command[1:]], [None], batch_mode=True)


def run(argv: list[str]) -> int:
    """``flux run [options] COMMAND...`` inside a job: one rank, run in place."""
    args = _parser("flux-run", batch_mode=False).parse_args(argv)
    if not args.command:
        print("flux-run: ERROR: job command and arguments are missing", file=sys.stderr)
        return 1
    os.environ.setdefault("FLUX_TASK_RANK", "0")
    os.execvp(args.command[0], args.command)
    return 127  # not reached


# -- listing -------------------------------------------------------------------------------------

STATUS = {
    "pending": ("SCHED", "SCHED", "", "S"),
    "running": ("RUN", "RUN", "", "R"),
    "done": ("COMPLETED", "INACTIVE", "COMPLETED", "I"),
    "failed": ("FAILED", "INACTIVE", "FAILED", "I"),
    "cancelled": ("CANCELED", "INACTIVE", "CANCELED", "I"),
    "timeout": ("TIMEOUT", "INACTIVE", "TIMEOUT", "I"),
    "lost": ("FAILED", "INACTIVE", "FAILED", "I"),
}
ABBREV = {
    "SCHED": "S",
    "RUN": "R",
    "COMPLETED": "CD",
    "FAILED": "F",
    "CANCELED": "CA",
    "TIMEOUT": "TO",
    "": "",
}
EXCEPTIONS = {
    "cancelled": ("cancel", ""),
    "timeout": ("timeout", "resource allocation expired"),
    "lost": ("exec", "lost contact with job shell"),
}
DEFAULT_FORMAT = (
    "{id.f58:>12} {username:<8.8} {name:<10.10} {status_abbrev:>2.2} {ntasks:>6} {runtime!F:>8h}"
)


HEADERS = {
    "id": "JOBID",
    "id.f58": "JOBID",
    "id.dec": "JOBID",
    "id.hex": "JOBID",
    "username": "USER",
    "userid": "UID",
    "status_abbrev": "ST",
    "state_single": "ST",
    "result_abbrev": "RS",
    "runtime": "TIME",
    "exception.type": "EXCEPTION-TYPE",
    "exception.note": "EXCEPTION-NOTE",
}


def _values(job: dict[str, Any] | None) -> dict[str, Any]:
    if job is None:  # the field names, for the header
        job = {
            "id": "0",
            "user": "",
            "name": "",
            "extra": {},
            "elements": {
                "0": {
                    "state": "pending",
                    "start": None,
                    "end": None,
                    "exit_code": None,
                    "submitted": 0.0,
                }
            },
        }
    el = job["elements"]["0"]
    state = el["state"]
    status, flux_state, result, single = STATUS[state]
    job_id = int(job["id"])
    exc_type, exc_note = EXCEPTIONS.get(state, ("", ""))
    if state == "cancelled" and not el["start"]:
        returncode: Any = -128
    elif state in fakecore.TERMINAL:
        returncode = el["exit_code"] if el["exit_code"] is not None else 1
    else:
        returncode = ""
    end = el["end"] or time.time()
    return {
        "id": job_id,
        "id.f58": f58(job_id),
        "id.dec": job_id,
        "id.hex": f"0x{job_id:x}",
        "userid": os.getuid(),
        "username": job["user"],
        "name": job["name"],
        "status": status,
        "status_abbrev": ABBREV[status] if status in ABBREV else status[:2],
        "state": flux_state,
        "state_single": single,
        "result": result,
        "result_abbrev": ABBREV.get(result, ""),
        "success": (state == "done") if state in fakecore.TERMINAL else "",
        "returncode": returncode,
        "waitstatus": "" if returncode == "" else (el["exit_code"] or 0) << 8,
        "exception.occurred": bool(exc_type) if state in fakecore.TERMINAL else "",
        "exception.type": exc_type,
        "exception.note": exc_note,
        "exception.severity": 0 if exc_type else "",
        "ntasks": job["extra"].get("ntasks", 1),
        "nnodes": 1 if el["start"] else "",
        "queue": job["extra"].get("queue", ""),
        "urgency": job["extra"].get("urgency", "16"),
        "t_submit": el["submitted"],
        "t_run": el["start"] or 0.0,
        "t_inactive": el["end"] or 0.0,
        "runtime": (end - el["start"]) if el["start"] else 0.0,
    }


def _render(fmt: str, values: dict[str, Any], header: bool = False) -> str:
    out: list[str] = []
    for literal, field, spec, conversion in string.Formatter().parse(fmt):
        out.append(literal)
        if field is None:
            continue
        if field not in values:
            raise KeyError(field)
        value = values[field]
        if header:
            out.append(format(str(value), (spec or "").rstrip("h")))
            continue
        if conversion in ("F", "H"):
            value = f"{float(value or 0):.1f}s"
        elif conversion == "D":
            value = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(value)) if value else ""
        spec = spec or ""
        if spec.endswith("h"):
            spec = spec[:-1]
            if value in ("", "0s", "0.0", "0:00:00", "0.0s", 0, 0.0):
                value = "-"
        out.append(
            format(
                value
                if isinstance(value, (int, float)) and not isinstance(value, bool) and spec
                else str(value),
                spec,
            )
        )
    return "".join(out)


def jobs(argv: list[str]) -> int:
    """``flux jobs [-a] [-A] [-n] [-o FORMAT] [-f FILTER] [-c N] [IDS]``."""
    p = argparse.ArgumentParser(prog="flux-jobs", allow_abbrev=False)
    p.add_argument("-a", action="store_true")
    p.add_argument("-A", action="store_true")
    p.add_argument("-n", "--no-header", "--suppress-header", dest="no_header", action="store_true")
    p.add_argument("-o", "--format", default=DEFAULT_FORMAT)
    p.add_argument("-f", "--filter", default="")
    p.add_argument("-c", "--count", type=int, default=1000)
    p.add_argument("-u", "--user")
    p.add_argument("ids", nargs="*")
    args = p.parse_args(argv)
    queue = fakecore.read(SCHED)
    rc = 0
    selected: list[dict[str, Any]] = []
    if args.ids:
        for text in args.ids:
            value = parse_id(text)
            job = queue["jobs"].get(str(value)) if value is not None else None
            if job is None:
                print(f"flux-jobs: ERROR: {text}: job not found", file=sys.stderr)
                rc = 1
            else:
                selected.append(job)
    else:
        wanted = {"pending", "running"}
        if args.a or args.A:
            wanted |= {"inactive"}
        for f in filter(None, args.filter.lower().split(",")):
            wanted = {"pending", "running", "inactive"} if f == "all" else wanted | {f}
        for job in sorted(queue["jobs"].values(), key=lambda j: -int(j["id"])):
            el = job["elements"]["0"]
            group = "inactive" if el["state"] in fakecore.TERMINAL else el["state"]
            result = STATUS[el["state"]][2].lower()
            if group in wanted or (result and result in wanted):
                selected.append(job)
        selected = selected[: args.count]
    try:
        lines = [_render(args.format, _values(job)) for job in selected]
        header = _render(
            args.format,
            {k: HEADERS.get(k, k.split(".")[0].upper()) for k in _values(None)},
            header=True,
        )
    except KeyError as exc:
        print(f"flux-jobs: ERROR: Unknown format field: {exc.args[0]}", file=sys.stderr)
        return 1
    if not args.no_header:
        print(header)
    for line in lines:
        print(line)
    return rc


# -- cancel, job info ----------------------------------------------------------------------------


def cancel(argv: list[str]) -> int:
    """``flux cancel [-m MESSAGE] IDS``."""
    ids: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in ("-m", "--message"):
            i += 2
            continue
        if argv[i].startswith("-"):
            i += 1
            continue
        ids.append(argv[i])
        i += 1
    if not ids:
        print("flux-cancel: ERROR: One or more jobids or --all is required", file=sys.stderr)
        return 1
    rc = 0
    with fakecore.locked(SCHED) as queue:
        for text in ids:
            value = parse_id(text)
            job = queue["jobs"].get(str(value)) if value is not None else None
            if job is None:
                print(f"flux-cancel: ERROR: {text}: unknown job id", file=sys.stderr)
                rc = 1
            elif not fakecore.cancel_element(job["elements"]["0"]):
                print(f"flux-cancel: ERROR: {text}: job is inactive", file=sys.stderr)
                rc = 1
        fakecore.tick(SCHED, queue)
    return rc


def job_info(argv: list[str]) -> int:
    """``flux job info ID KEY``: ``jobspec`` and ``eventlog`` as JSON."""
    if len(argv) != 2:
        print("flux-job: ERROR: usage: flux job info JOBID KEY", file=sys.stderr)
        return 1
    value = parse_id(argv[0])
    queue = fakecore.read(SCHED)
    job = queue["jobs"].get(str(value)) if value is not None else None
    if job is None:
        print(f"flux-job: ERROR: {argv[0]}: job not found", file=sys.stderr)
        return 1
    el = job["elements"]["0"]
    if argv[1] == "jobspec":
        spec = {
            "version": 1,
            "tasks": [{"command": job["argv"], "slot": "task", "count": {"per_slot": 1}}],
            "attributes": {
                "system": {
                    "job": {"name": job["name"]},
                    "cwd": job["cwd"],
                    "environment": job["env"],
                }
            },
        }
        print(json.dumps(spec))
        return 0
    if argv[1] == "eventlog":
        events = [("submit", el["submitted"])]
        if el["start"]:
            events.append(("start", el["start"]))
        if el["end"]:
            events += [("finish", el["end"]), ("clean", el["end"])]
        for name, stamp in events:
            print(json.dumps({"timestamp": stamp, "name": name, "context": {}}))
        return 0
    print(f"flux-job: ERROR: {argv[1]}: key not found", file=sys.stderr)
    return 1
