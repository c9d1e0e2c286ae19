"""``python -m elsewhere.hosts.agent``: what a client asks of a host that holds a job copy.

The ssh backend keeps a copy of the job folder on every node; the workers
there claim tasks from that copy's queue. One ssh command per node and poll
runs this agent, which does on the node what the local backend does here:

    start  JOB --workers N [--tasks a:b --retries R]
                                   (this node's share of the tasks) start N
                                   detached workers for the job
    poll   JOB --workers N         write off vanished workers (their running
                                   task "lost" or retried), start replacements
                                   while work remains; print the queue state
    add    JOB --tasks 3,7,9       put tasks (moved from another node) in the queue
    cancel JOB                     stop the job's workers; nothing new starts
    info   [DIR]                   python, elsewhere, cores, load, memory, and
                                   whether DIR is writable
    serve                          all of the above, and file writes, as
                                   requests on stdin (see below)

Every answer is one JSON line on stdout, after a marker, so login banners do
not confuse the client.

``serve`` keeps one process per client and host for a whole session, so that
the probe, the copy of the job folder, the start and every poll cost a
message instead of a remote login shell (hundreds of ms on some accounts).
The wire, on the session's stdin and stdout:

    request   one line of JSON, at most 1 MiB:
              {"v": 1, "id": 7, "op": "poll", ...fields, "body": n}
              then exactly n raw bytes when "body" is given (only "put")
    answer    one line "ELSEWHERE-AGENT " + JSON {"id": 7, ...}; every op
              but "put" answers; an error is {"id": 7, "error": "..."}

    ops       info {dir} | start {job, workers, tasks, retries}
              poll {job, workers} | add {job, tasks} | cancel {job}
              put {dir, path, offset, body, [truncate, mode, mtime, kind]}:
                  write the body at offset into dir/path (kind "dir": make
                  the folder; kind "link" with "target": make a symlink);
                  no answer, a failure is kept and reported by the next "start"
              discard {dir}: remove a copy that will not be used

The agent exits at the end of its stdin (the client or its connection went),
on a request it cannot parse, or after ``--idle-s`` seconds without a request.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ..folder.journal import lock_is_free, reap
from ..folder.queue import new_queue
from ..folder.store import CONTROL, CONTROL_ID, JobStore
from ..util.paths import private_dir
from .spawn import spawn_python

MARKER = "ELSEWHERE-AGENT "


def _spawn(job: Path, count: int) -> list[int]:
    private_dir(job / "logs")
    argv = ["-m", "elsewhere.worker", "--job", str(job)]
    return [spawn_python(argv, log=job / "logs" / "workers-start.log", cwd=job).pid
            for _ in range(count)]


def start(job: Path, workers: int, tasks: str = "", retries: int = 0) -> dict[str, Any]:
    """Start workers; with ``tasks`` ("a:b"), first make this node's queue hold those tasks."""
    store = JobStore(job)
    named = job / CONTROL_ID
    if not named.exists():  # this copy's reapers write under a name of their own (store.is_control)
        named.write_text(f"{CONTROL}.{os.urandom(4).hex()}\n")
    with store.locked_queue() as q:
        if tasks:
            a, b = (int(x) for x in tasks.split(":"))
            q.reset(new_queue(b, retries=retries, max_workers=workers))
            q.submit(assigned=a)
        q.submit(max_workers=workers)
    private_dir(job / "files")
    return {"pids": _spawn(job, workers)}


def poll(job: Path, workers: int) -> dict[str, Any]:
    store = JobStore(job)
    with store.locked_queue() as q:
        gone = reap(store, q) if q.submitted and not q.cancelled else []
        live = q.live_members()
        work = q.unclaimed()
        want = 0 if q.cancelled else max(0, min(workers, work) - live)
        if want:
            q.set_max_workers(max(q.max_workers, live + want))
        state = {"n": q.n, "next": q.next, "retry": q.to_rerun, "cancelled": q.cancelled,
                 "lost_by": q.d.get("lost_by", {}), "lost_reason": q.d.get("lost_reason", {}),
                 "lost_ranges": q.d.get("lost_ranges", []),  # tasks its failed workers wrote off
                 "members": {w: {"state": m.get("state"), "pid": m.get("pid"), "host": m.get("host"),
                                 "claim": m.get("claim", [])}
                             for w, m in q.members.items()}}  # fmt: skip
    pids = _spawn(job, want) if want else []
    return {"gone": gone, "started": pids, "live": live, "work": work, "queue": state}


def add(job: Path, tasks: list[int]) -> dict[str, Any]:
    """Tasks moved here from a node that was abandoned: run them first."""
    store = JobStore(job)
    with store.locked_queue() as q:
        have = set(q.to_rerun)
        q.requeue([t for t in tasks if t not in have], lost_attempt=True)
    return poll(job, store.queue().max_workers)


def retry(job: Path, attempts: dict[int, int], workers: int) -> dict[str, Any]:
    """Run tasks of this node again (``{task: attempt}``: ``job.retry()`` or a rerun of lost
    tasks, decided by the client), then start workers for them."""
    store = JobStore(job)
    with store.locked_queue() as q:
        q.retry(attempts)
    return poll(job, workers)


def cancel_task(job: Path, task: int) -> dict[str, Any]:
    """Cancel one task of this node: it does not start; its worker, if it runs it, is stopped
    (the worker's other tasks go back to the queue)."""
    store = JobStore(job)
    killed = 0
    with store.locked_queue() as q:
        q.cancel_task(task)
        dead = set()
        for wid, m in q.members.items():
            if m.get("state") == "active" and store.runs_task(wid, m, task):
                killed += _kill(m)
                dead.add(wid)
        if dead:
            reap(store, q, dead=dead)
    return {"killed": killed}


def cancel(job: Path) -> dict[str, Any]:
    store = JobStore(job)
    killed = 0
    with store.locked_queue() as q:
        for m in q.cancel_job():
            killed += _kill(m)
            m["state"] = "dead"
    return {"killed": killed}


def _kill(member: dict[str, Any]) -> int:
    """SIGKILL a worker that holds its lock (it lives); 1 if one was killed."""
    if lock_is_free(member.get("lock", "")):
        return 0
    try:
        os.killpg(int(member["pid"]), signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return 0
    return 1


def info(directory: str | None) -> dict[str, Any]:
    """This host's probe (:mod:`elsewhere.hosts.probe`), rsync's path, and whether
    ``directory`` can be made and written."""
    import shutil

    from .probe import probe_host

    out = probe_host().to_dict()
    out["rsync"] = shutil.which("rsync")
    if directory:
        d = Path(os.path.expanduser(directory))
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            probe = d / f".probe-{os.getpid()}"
            probe.write_text("ok")
            probe.unlink()
            out["writable"] = str(d.resolve())
        except OSError as exc:
            out["writable"] = None
            out["writable_error"] = str(exc)
    return out


# -- serve: one long session ------------------------------------------------------

WIRE_VERSION = 1
MAX_LINE = 1 << 20
MAX_BODY = 1 << 40
_CHUNK = 1 << 20


class _Input:
    """Lines and exact byte counts from a file descriptor, with one buffer."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.block = bytearray(_CHUNK)

    def wait(self, timeout_s: float) -> bool:
        import select

        if self.buf:
            return True
        return bool(select.select([self.fd], [], [], timeout_s)[0])

    def line(self) -> bytes | None:
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                out = bytes(self.buf[:end])
                del self.buf[: end + 1]
                return out
            if len(self.buf) > MAX_LINE:
                raise ValueError(f"a request line longer than {MAX_LINE} bytes")
            data = os.read(self.fd, 1 << 16)
            if not data:
                return None
            self.buf += data

    def chunks(self, n: int) -> Any:
        """Yield memoryviews of exactly ``n`` bytes in all (EOFError if the input ends)."""
        if self.buf:
            take = min(n, len(self.buf))
            yield memoryview(bytes(self.buf[:take]))
            del self.buf[:take]
            n -= take
        view = memoryview(self.block)
        while n > 0:
            got = os.readv(self.fd, [view[: min(n, _CHUNK)]])
            if not got:
                raise EOFError("the input ended inside a request body")
            yield view[:got]
            n -= got


def _inside(root: Path, rel: str) -> Path:
    parts = [p for p in rel.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or ".." in parts or rel.startswith("/"):
        raise ValueError(f"unsafe path {rel!r}")
    target = root.joinpath(*parts)
    real_root = os.path.realpath(root)
    if not os.path.realpath(target.parent).startswith(real_root.rstrip(os.sep) + os.sep) and \
            os.path.realpath(target.parent) != real_root:
        raise ValueError(f"refusing to write through a symlink: {target}")
    return target


def _put(inp: _Input, req: dict[str, Any], size: int) -> str | None:
    """Write one put's body; always consume it. Returns what went wrong, or None."""
    error = None
    fd = -1
    try:
        root = Path(os.path.expanduser(str(req["dir"])))
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = _inside(root, str(req["path"]))
        if req.get("kind") == "dir":
            target.mkdir(mode=0o700, parents=True, exist_ok=True)
        elif req.get("kind") == "link":  # as it is, like rsync -l; writes never go through it
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if os.path.lexists(target):
                target.unlink()
            os.symlink(str(req["target"]), target)
        else:
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if req.get("truncate") else 0)
            fd = os.open(target, flags, 0o600)
            os.lseek(fd, int(req.get("offset", 0)), os.SEEK_SET)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        error = f"put {req.get('path')!r}: {exc}"
    try:
        for part in inp.chunks(size):
            while fd >= 0 and len(part):
                try:
                    part = part[os.write(fd, part):]
                except OSError as exc:
                    error = f"writing {req.get('path')!r}: {exc}"
                    os.close(fd)
                    fd = -1
        if fd >= 0 and "mode" in req:
            os.fchmod(fd, int(req["mode"]) & 0o7777)
        if fd >= 0 and "mtime" in req:
            os.utime(fd, (float(req["mtime"]), float(req["mtime"])))
    except OSError as exc:
        error = error or f"finishing {req.get('path')!r}: {exc}"
    finally:
        if fd >= 0:
            os.close(fd)
    return error


def _answer(req: dict[str, Any], failed: str | None) -> dict[str, Any]:
    op = req.get("op")
    if op == "info":
        return info(req.get("dir"))
    if op == "discard":
        import shutil

        shutil.rmtree(os.path.expanduser(str(req["dir"])), ignore_errors=True)
        return {}
    job = Path(os.path.expanduser(str(req.get("job", ""))))
    if op == "start" and failed:
        return {"error": f"the copy of the job folder is incomplete: {failed}"}
    if not (job / "job.json").exists():
        return {"error": f"no job folder at {job}"}
    if op == "start":
        return start(job, int(req.get("workers", 1)), str(req.get("tasks", "")), int(req.get("retries", 0)))
    if op == "poll":
        return poll(job, int(req.get("workers", 1)))
    if op == "add":
        return add(job, [int(t) for t in req.get("tasks", [])])
    if op == "retry":
        attempts = {int(t): int(a) for t, a in dict(req.get("attempts", {})).items()}
        return retry(job, attempts, int(req.get("workers", 1)))
    if op == "cancel_task":
        return cancel_task(job, int(req.get("task", -1)))
    if op == "cancel":
        return cancel(job)
    return {"error": f"unknown request {op!r}"}


def serve(fd_in: int = 0, out: Any = None, idle_s: float = 120.0) -> int:
    """Answer requests from ``fd_in`` until it ends (see the module docstring)."""
    out = out or sys.stdout
    inp = _Input(fd_in)
    failed: str | None = None
    while inp.wait(idle_s):
        try:
            line = inp.line()
            if line is None:
                return 0
            req = json.loads(line)
            if not isinstance(req, dict) or req.get("v") != WIRE_VERSION:
                raise ValueError(f"not a version-{WIRE_VERSION} request: {line[:200]!r}")
            size = int(req.get("body", 0))
            if not 0 <= size <= MAX_BODY:
                raise ValueError(f"body size {size} out of range")
        except ValueError as exc:  # the stream cannot be trusted any more: say so and stop
            out.write("\n" + MARKER + json.dumps({"id": None, "error": f"bad request: {exc}"}) + "\n")
            out.flush()
            return 2
        if req.get("op") == "put":
            error = _put(inp, req, size)  # always: it consumes the body
            failed = failed or error
            continue
        try:
            ans = _answer(req, failed)
        except Exception as exc:  # an answer, not a dead session: the client says which op failed
            ans = {"error": f"{req.get('op')} failed on {os.uname().nodename}: {type(exc).__name__}: {exc}"}
        if req.get("op") == "start":
            failed = None
        out.write("\n" + MARKER + json.dumps({**ans, "id": req.get("id")}) + "\n")
        out.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m elsewhere.hosts.agent")
    p.add_argument("op", choices=["start", "poll", "add", "cancel", "info", "serve"])
    p.add_argument("job", nargs="?")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--tasks", default="")
    p.add_argument("--retries", type=int, default=0)
    p.add_argument("--idle-s", type=float, default=120.0)
    a = p.parse_args(argv)
    if a.op == "serve":
        return serve(idle_s=a.idle_s)
    if a.op == "info":
        out = info(a.job)
    else:
        if not a.job:
            p.error("give the job folder")
        job = Path(a.job)
        if not (job / "job.json").exists():
            print(MARKER + json.dumps({"error": f"no job folder at {job}"}))
            return 3
        if a.op == "start":
            out = start(job, a.workers, a.tasks, a.retries)
        elif a.op == "poll":
            out = poll(job, a.workers)
        elif a.op == "add":
            out = add(job, [int(t) for t in a.tasks.split(",") if t])
        else:
            out = cancel(job)
    sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
    return 0


def parse_answer(text: str) -> dict[str, Any] | None:
    """The agent's JSON answer in ``text`` (after any login banner), or None."""
    for line in reversed(text.splitlines()):
        if line.startswith(MARKER):
            try:
                value = json.loads(line[len(MARKER):])
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


if __name__ == "__main__":
    sys.exit(main())
