"""The jobs the web view shows: the registry, each job followed by a :class:`~.watch.JobWatch`.

The same data as ``elsewhere jobs`` (``ew.jobs()``): every registered job, its state and
counts from a snapshot of its folder, a job that cannot be opened shown as
``unreadable: why``, one whose folder is missing as ``missing``. Unlike ``ew.jobs()``, a job
is opened once and kept open, so a look every quarter second reads only what is new, and a
job that is done is read again only when its queue or its journal folder changed (a retry,
a purge) or every :data:`_DONE_LOOK_S`.

One lock: the server's threads (requests, the event loop's refresher) take turns.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from ...folder.registry import Registry
from ...util.errors import JobNotFound
from ..commands import cluster_object
from .watch import JobWatch, folder_stamp

__all__ = ["JobBoard", "stable"]

_DONE_LOOK_S = 30.0  # a job that is done, and whose folder did not change, is read this often
_FRESH_S = 0.3  # a request within this long of the last refresh is answered from it


class JobBoard:
    """Every registered job, followed (see the module doc)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._watches: dict[str, JobWatch] = {}
        self._broken: dict[str, tuple[tuple[int, ...], str]] = {}  # id -> (folder stamp, why)
        self._rows: list[dict[str, Any]] = []
        self._by_id: dict[str, dict[str, Any]] = {}
        self._refreshed_at = 0.0
        self.version = 0  # moves whenever a row of the jobs table changed

    def refresh(self, *, max_age_s: float = 0.0) -> bool:
        """Look at every job again (unless the last look is younger than ``max_age_s``);
        True if any row changed."""
        with self.lock:
            if max_age_s and time.monotonic() - self._refreshed_at < max_age_s:
                return False
            rows = self._read()
            self._refreshed_at = time.monotonic()
            changed = [stable(r) for r in rows] != [stable(r) for r in self._rows]
            self._rows = rows
            self._by_id = {r["id"]: r for r in rows}
            if changed:
                self.version += 1
            return changed

    def rows(self) -> list[dict[str, Any]]:
        """The jobs table, as of a look at most :data:`_FRESH_S` old."""
        self.refresh(max_age_s=_FRESH_S)
        with self.lock:
            return list(self._rows)

    def watch(self, job_id: str, *, fresh: bool = True) -> JobWatch:
        """The watch of job ``job_id`` (an id, or a name: the newest job of that name);
        JobNotFound if there is none. ``fresh``: read what is new first."""
        with self.lock:
            w = self._watches.get(job_id)
            if w is None:
                rows = Registry().find(job_id)
                if not rows:
                    raise JobNotFound(f"no job named {job_id!r} (see `elsewhere jobs`)")
                w = self._watches.get(rows[0]["id"]) or self._open(rows[0])  # (a name: its id's)
            if fresh and time.monotonic() - w.refreshed_at >= _FRESH_S and self._due(w):
                w.refresh()
            w.looked_at = time.monotonic()
            return w

    def forget(self, job_id: str) -> None:
        """Stop following a job (purged)."""
        with self.lock:
            self._watches.pop(job_id, None)
            self._rows = [r for r in self._rows if r["id"] != job_id]
            self.version += 1

    # -- reading the registry -----------------------------------------------------------
    def _open(self, row: dict[str, Any]) -> JobWatch:
        w = JobWatch(row)
        self._watches[w.id] = w
        return w

    def _read(self) -> list[dict[str, Any]]:
        out = []
        seen = set()
        for row in Registry().all():
            seen.add(row["id"])
            entry = self._row(row)
            if entry is not None:
                out.append(entry)
        for gone in set(self._watches) - seen:  # purged
            del self._watches[gone]
        return out

    def _row(self, row: dict[str, Any]) -> dict[str, Any] | None:
        w = self._watches.get(row["id"])
        last = self._by_id.get(row["id"])
        if w is not None and last is not None and not self._due(w):
            return last  # done, and its folder did not change: as it was
        path = Path(row["path"])
        base = {"name": row["name"], "id": row["id"], "state": row["state"], "cluster": cluster_object(row["cluster"]),
                "created": row["created"], "n_tasks": row["n_tasks"], "path": row["path"], "counts": {}}  # fmt: skip
        base["kind"] = str((base["cluster"] or {}).get("kind", "?"))
        if not (path / "job.json").exists():
            if not path.exists() and path.parent.is_dir():
                return None  # purged while listed
            return {**base, "state": "missing"}
        try:
            if w is None:
                stamp = folder_stamp(path)
                broken = self._broken.get(row["id"])
                if broken is not None and broken[0] == stamp:
                    return {**base, "state": broken[1]}
                w = self._open(row)
                w.refresh()
            elif self._due(w):
                w.refresh()
            return w.summary(row)
        except Exception as exc:  # a damaged folder must not hide the others (as ew.jobs())
            if not path.exists():
                return None
            self._watches.pop(row["id"], None)
            why = f"unreadable: {exc}"
            self._broken[row["id"]] = (folder_stamp(path), why)
            return {**base, "state": why}

    @staticmethod
    def _due(w: JobWatch) -> bool:
        snap = w.snap
        if snap is None or not snap.job_state().done:
            return True
        return folder_stamp(w.path) != w.stamp or time.monotonic() - w.refreshed_at > _DONE_LOOK_S


def stable(row: dict[str, Any]) -> dict[str, Any]:
    """A row without what moves with the clock alone (elapsed, eta): the page counts those on."""
    return {k: v for k, v in row.items() if k not in ("elapsed", "eta")}
