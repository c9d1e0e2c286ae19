"""One job the web view follows: opened once, read again as it moves.

A :class:`JobWatch` opens the job folder with the code every other reader uses
(``core.submit.open_job``, ``control.snapshot``, the journal reader, ``OutcomeReader``), and
keeps the handle, so each look reads only what is new in the journals. What the page shows
of the job (its summary, its timeline, a page of its task table, one task's log and error)
is derived from the last snapshot and cached until the job changes (:attr:`JobWatch.digest`).

It never writes to the job folder: a damaged result body is shown as damaged, not marked (the
next ``job.results()`` or ``elsewhere status`` of the job does that); actions go through the
control functions (``actions.py``). Not thread-safe by itself: the board holds its lock.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...core import control
from ...core.submit import open_job
from ...folder.errorrecord import MARK, ErrorRecord
from ...folder.journal import read_body
from ...folder.outcomes import OutcomeReader
from ...folder.queue import Queue
from ...folder.records import Kind
from ...folder.snapshot import Snapshot
from ...folder.store import CONTROL, is_control
from ...util.errors import DamagedJob, TaskError
from . import columns as C

_LOG_MAX = 256 * 1024  # the tail of a task's output shown on the page
_REMOTE_POLL_S = 2.0  # a job whose workers write elsewhere, looked at in detail: polled this often
_REBUILD_FACTOR = 3.0  # a moving job's columns: rebuilt at most every 3 times the last build took


class JobWatch:
    """One job: its cluster and handle, its last snapshot and what the page is shown of it."""

    def __init__(self, row: dict[str, Any]) -> None:
        self.id: str = row["id"]
        self.path = Path(row["path"])
        self.cluster, self.handle = open_job(self.path)
        self.outcomes = OutcomeReader(self.handle)
        self.meta = dict(self.handle.spec)
        self.snap: Snapshot | None = None
        self.digest: tuple[Any, ...] = ()
        self.looked_at = 0.0  # when a page last followed this job in detail (monotonic)
        self.refreshed_at = 0.0
        self.stamp: tuple[int, ...] = ()
        self._polled_at = 0.0
        self._cols: C.TaskColumns | None = None
        self._builder = C.ColumnsBuilder()
        self._cols_digest: tuple[Any, ...] = ()
        self._built_at = 0.0
        self._build_s = 0.0
        self.version = 0  # how many times the columns were built
        self._timeline: tuple[int, bytes, bytes | None] | None = None
        self._summary: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._order: dict[tuple[Any, ...], list[int]] = {}
        self._lanes: list[str] = []
        self._lane_index: dict[str, int] = {}
        self._infos: dict[str, dict[str, Any]] = {}
        self._queue: Queue | None = None

    # -- reading ---------------------------------------------------------------------------
    def refresh(self) -> bool:
        """Read what is new; True if the job changed since the last look."""
        if (not self.cluster.shares_filesystem() and self.meta.get("submitted")
                and time.monotonic() - self.looked_at < 10.0
                and time.monotonic() - self._polled_at >= _REMOTE_POLL_S):  # fmt: skip
            # as ``job.state`` does: where workers write elsewhere, news arrives by polling
            self._polled_at = time.monotonic()
            control.poll(self.cluster, self.handle)
        with paused_gc():
            snap = control.snapshot(self.cluster, self.handle)
        self.snap = snap
        self.refreshed_at = time.monotonic()
        self.stamp = folder_stamp(self.path)
        counts = snap.counts()
        digest = (self.handle.reader.changes, snap.n, tuple(counts.values()), frozenset(snap.running),
                  snap.cancelled, snap.note, len(snap.cancelled_tasks))  # fmt: skip
        changed = digest != self.digest
        self.digest = digest
        return changed

    def columns(self) -> C.TaskColumns:
        """The tasks as columns, as of the last refresh; while the job moves, brought up to
        date (only the new spans laid out: ``columns.ColumnsBuilder``) at most every
        :data:`_REBUILD_FACTOR` times what the last update took (a complete layout of a
        100 000-task job of single records takes a few tenths of a second). ``version``
        counts the updates: the page fetches again when it moved."""
        cols = self._cols
        if cols is None or (self._cols_digest != self.digest
                            and time.monotonic() - self._built_at >= _REBUILD_FACTOR * self._build_s):  # fmt: skip
            t = time.monotonic()
            self._queue = None
            snap = self._snapshot()
            with paused_gc():
                cols = self._builder.update(snap, self.handle.outcomes.spans(), self._lane_of)
            self._cols, self._cols_digest = cols, self.digest
            self._built_at = time.monotonic()
            self._build_s = self._built_at - t
            self.version += 1
            self._order.clear()
        return cols

    def _snapshot(self) -> Snapshot:
        if self.snap is None:
            self.refresh()
        assert self.snap is not None
        return self.snap

    def _lane_of(self, wid: str, task: int) -> int:
        if is_control(wid):  # written off by a reaper or a cancel: the lane of whoever ran it
            if self._queue is None:  # read once per build
                self._queue = self.handle.store.queue()
            wid = self._queue.lost_by(task) or CONTROL
        i = self._lane_index.get(wid)
        if i is None:
            i = self._lane_index[wid] = len(self._lanes)
            self._lanes.append(wid)
        return i

    def _info(self, wid: str) -> dict[str, Any]:
        info = self._infos.get(wid)
        if info is None:
            info = (
                self.handle.store.worker_info(wid) if not is_control(wid) else {"host": "(written off)"}
            )
            if info:  # a worker's info does not change once written
                self._infos[wid] = info
        return info or {}

    def lanes(self) -> list[dict[str, Any]]:
        """Each lane's worker: ``{"id", "host", "pid"}``."""
        return [{"id": w, "host": str(self._info(w).get("host", "")), "pid": self._info(w).get("pid")}
                for w in self._lanes]  # fmt: skip

    def hosts(self) -> list[str]:
        return [str(self._info(w).get("host", "")) for w in self._lanes]

    # -- what the page shows -----------------------------------------------------------------
    def summary(self, row: dict[str, Any] | None = None) -> dict[str, Any]:
        """The job's line in the jobs table: the fields of ``elsewhere jobs --json``, and
        started, ended, elapsed, estimated time left (from the rate of tasks done so far),
        progress. Made again only when the job changed; elapsed and eta move with the clock."""
        cols = self.columns()
        key = (self.digest, self.version)
        if self._summary is None or self._summary[0] != key:
            snap = self._snapshot()
            counts = {s.value: k for s, k in snap.counts().items() if k}
            state = snap.job_state()
            done = sum(counts.get(s, 0) for s in ("finished", "failed", "cancelled"))
            meta = self.meta
            cluster = meta.get("cluster") or {}
            self._summary = (key, {
                "name": meta.get("name"), "id": self.id, "state": state.value, "n_tasks": snap.n,
                "counts": counts, "cluster": cluster, "kind": str(cluster.get("kind", "?")),
                "created": (row or {}).get("created", meta.get("created")), "path": str(self.path),
                "user": meta.get("user", ""), "tag": meta.get("tag", ""), "submitted": meta.get("submitted"),
                "started": cols.started(), "ended": cols.ended() if state.done else None,
                "last_end": cols.ended(), "done": done,
                "progress": done / snap.n if snap.n else (1.0 if state.done else 0.0),
                "note": snap.note, "changes": self.handle.reader.changes, "running": len(snap.running),
                "version": self.version,
            })  # fmt: skip
        out = dict(self._summary[1])
        out["elapsed"], out["eta"] = timing(out, time.time())
        return out

    def detail(self) -> dict[str, Any]:
        """The job page's header: its summary, settings, cluster data, job scripts and the
        backend's reasons for waiting tasks (grouped)."""
        snap = self._snapshot()
        meta = self.meta
        settings = {k: meta.get(k) for k in ("cores_per_task", "retries", "seed", "env", "cwd", "sys_path",
                                             "communicating", "ranks", "stream", "waited", "format")
                    if meta.get(k) not in (None, "", [], {})}  # fmt: skip
        reasons: dict[str, list[int]] = {}
        for t, r in sorted(snap.reasons.items()):
            reasons.setdefault(r, []).append(t)
        try:
            data = self.handle.cluster_data()
        except (OSError, ValueError) as exc:
            data = {"unreadable": str(exc)}
        return {**self.summary(), "settings": settings, "cluster_data": data, "scripts": self.scripts(),
                "reasons": [{"reason": r, "tasks": ts[:50], "count": len(ts)} for r, ts in
                            sorted(reasons.items(), key=lambda kv: -len(kv[1]))[:20]],
                "lanes": self.lanes()}  # fmt: skip

    def scripts(self) -> list[dict[str, str]]:
        """The job scripts a batch backend submitted (``submissions/*.sh``), at most 10."""
        out = []
        folder = self.path / "submissions"
        for p in sorted(folder.glob("*.sh"), key=lambda p: (len(p.name), p.name))[:10]:
            try:
                out.append({"name": p.name, "text": p.read_text(errors="replace")[:65536]})
            except OSError:
                continue
        return out

    def timeline(self, *, gzipped: bool = False) -> bytes:
        """The timeline (``columns.timeline_bytes``), gzipped if asked, cached until the columns
        move again (a job of 100 000 single records: 3.3 MB, 0.5 MB gzipped)."""
        cols = self.columns()
        if self._timeline is None or self._timeline[0] != self.version:
            self._timeline = (self.version, C.timeline_bytes(cols, self.lanes(), time.time()), None)
        version, body, packed = self._timeline
        if not gzipped:
            return body
        if packed is None:
            packed = gzip.compress(body, compresslevel=1)
            self._timeline = (version, body, packed)
        return packed

    def task_page(self, *, offset: int = 0, limit: int = 100, sort: str = "task", desc: bool = False,
                  state: str | None = None, host: str | None = None) -> dict[str, Any]:  # fmt: skip
        """One page of the task table, sorted and filtered on the server (a job may have
        100 000 tasks: the page holds ``limit`` rows)."""
        cols = self.columns()
        hosts = self.hosts()
        key = (sort, desc, state, host)
        idx = self._order.get(key)
        if idx is None:
            idx = C.order(cols, sort, desc, hosts, C.select(cols, state, host, hosts))
            if len(self._order) > 16:
                self._order.clear()
            self._order[key] = idx
        rows = [self.task_row(t, cols, hosts) for t in idx[offset : offset + limit]]
        return {"total": len(idx), "offset": offset, "rows": rows, "counts": C.counts_of(cols)}

    def task_row(self, t: int, cols: C.TaskColumns, hosts: list[str]) -> dict[str, Any]:
        snap = self._snapshot()
        lane = cols.lane[t]
        start, end = cols.start[t], cols.end[t]
        state = C.STATES[cols.state[t]].value
        reason = snap.reasons.get(t, "")
        if state in ("failed", "cancelled") and not reason:
            err = self.error(t)
            reason = f"{err['type']}: {err['message']}".split("\n", 1)[0][:300] if err else ""
        return {"task": t, "state": state, "host": hosts[lane] if lane >= 0 else "",
                "worker": self._lanes[lane] if lane >= 0 else "", "attempt": cols.attempt[t],
                "started": start or None, "seconds": (end - start) if start > 0 and end > 0 else None,
                "batch": cols.batch[t], "reason": reason}  # fmt: skip

    def error(self, t: int) -> dict[str, Any] | None:
        """Task ``t``'s error (type, message, traceback, host, reason), read without loading
        the exception object itself; None if it has none."""
        snap = self._snapshot()
        f = self.handle.outcomes.get(t)
        if f is None:
            if snap.task_state(t).value != "cancelled":
                return None
            return {"type": "Cancelled", "message": "the task was cancelled before it finished",
                    "traceback": "", "host": "", "reason": "cancelled"}  # fmt: skip
        wid, rec = f
        if rec.kind == Kind.OK:
            return None
        if rec.kind == Kind.ERROR:
            try:
                value = read_body(self.handle.store, wid, rec, {}, t)
            except DamagedJob as exc:
                return {"type": "DamagedJob", "message": f"{exc.path}, task {t}, {exc.what}",
                        "traceback": "", "host": "", "reason": "damaged"}  # fmt: skip
            if not (isinstance(value, dict) and MARK in value):
                return None  # a task that returned a TaskError as its value
            er = ErrorRecord.from_value(value)
            return {"type": er.type_name, "message": er.message, "traceback": er.traceback,
                    "host": er.host, "pid": er.pid, "reason": "error"}  # fmt: skip
        err: TaskError = self.outcomes.lost_error(t, rec) if rec.kind == Kind.LOST else TaskError(
            "the task was cancelled", type_name="Cancelled", reason="cancelled")  # fmt: skip
        return {"type": err.type_name, "message": err.message, "traceback": err.traceback,
                "host": err.host, "reason": err.reason}  # fmt: skip

    def task_detail(self, t: int) -> dict[str, Any]:
        """Everything the page shows of task ``t``: its row, its output (the tail) and error."""
        snap = self._snapshot()
        t = control.task_index(self.handle, t, snap.n)
        cols = self.columns()
        row = self.task_row(t, cols, self.hosts())
        info = self._info(row["worker"]) if row["worker"] else {}
        f = self.handle.outcomes.get(t)
        log = self.outcomes.log(t, snap)
        cut = max(0, len(log) - _LOG_MAX)
        return {**row, "pid": info.get("pid"), "python": info.get("python", ""),
                "ended": cols.end[t] or None, "peak_rss": f[1].peak_rss if f is not None else None,
                "seed": f[1].seed if f is not None else None, "log": log[cut:], "log_cut": cut,
                "error": self.error(t)}  # fmt: skip


def timing(row: dict[str, Any], now: float) -> tuple[float | None, float | None]:
    """(elapsed, estimated time left) of a job's row at ``now``: the tasks still to end at the
    rate the others ended, less the time since the last one did (the page counts the same)."""
    started, last = row.get("started"), row.get("last_end")
    if not started:
        return None, None
    elapsed = (row.get("ended") or now) - started
    done, n = row.get("done", 0), row.get("n_tasks", 0)
    if row.get("ended") or not done or not last or last <= started:
        return elapsed, None
    return elapsed, max(0.0, (n - done) / (done / (last - started)) - (now - last))


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused: reading a job of 100 000 single records makes as
    many objects, and each collection they set off walks every object the server holds (the
    records it keeps included), which took most of the time of a look. Nothing made meanwhile
    is cyclic garbage; a collection runs afterwards as usual."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def folder_stamp(path: Path) -> tuple[int, ...]:
    """What changes when anything of a job moves: its queue's two slots and its journal folder
    (a new worker); the board reads a job that is done again only when this changed."""
    out = []
    folder = str(path)
    for name in ("queue.json", "queue.b.json", "journal"):
        try:
            out.append(os.stat(os.path.join(folder, name)).st_mtime_ns)
        except OSError:
            out.append(0)
    return tuple(out)
