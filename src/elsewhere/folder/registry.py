"""The registry of jobs: name -> job folder, cached state.

A SQLite file in the home folder (``<home>/registry.sqlite``), in WAL mode
with a busy timeout, so two processes submitting at once both succeed and
never corrupt it. The job folder stays the source of truth; the registry
only finds folders and caches their last known state.

A process keeps one connection per thread and registry file (closing the
last connection of a WAL database checkpoints it, which costs more than the
queries of a whole job); it is opened again after a fork, or when the file
was replaced or removed.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..util import paths
from ..util.errors import NameInUse

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    path TEXT NOT NULL,
    cluster TEXT NOT NULL,
    user TEXT,
    tag TEXT,
    created REAL,
    n_tasks INTEGER,
    state TEXT,
    updated REAL
);
CREATE INDEX IF NOT EXISTS jobs_name ON jobs(name);
"""

_DONE = ("finished", "failed", "cancelled")

_local = threading.local()  # .cons: {path: (pid, inode, connection)}


class _Borrowed:
    """A cached connection handed out for one call; ``close()`` keeps it open."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self._con = con

    def execute(self, *args: Any) -> sqlite3.Cursor:
        return self._con.execute(*args)

    def close(self) -> None:
        if self._con.in_transaction:
            self._con.execute("ROLLBACK")


class Registry:
    """Access to the job registry."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else paths.registry_path()

    def _connect(self) -> Any:
        key = str(self.path)
        cons = getattr(_local, "cons", None)
        if cons is None:
            cons = _local.cons = {}
        try:
            inode = os.stat(key).st_ino
        except FileNotFoundError:
            inode = None
        cached = cons.get(key)
        if cached is not None:
            pid, ino, con = cached
            if pid == os.getpid() and ino == inode:
                return _Borrowed(con)
            del cons[key]
            if pid == os.getpid():
                con.close()
        con = self._open()
        cons[key] = (os.getpid(), os.stat(key).st_ino, con)
        return _Borrowed(con)

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        con = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        con.row_factory = sqlite3.Row
        con.execute("PRAGMA synchronous=NORMAL")
        if con.execute("PRAGMA user_version").fetchone()[0] < 1:
            # First use of this file: WAL (it sticks to the file) and the schema, once.
            con.execute("PRAGMA journal_mode=WAL")
            con.executescript(_SCHEMA)
            con.execute("PRAGMA user_version = 1")
        return con

    def add(self, meta: dict[str, Any], path: Path, current_state: Callable[[dict[str, Any]], str | None]) -> None:
        """Register a job; raise NameInUse if a running job has the same name.

        ``current_state(row)`` reads, from the job folder, the state of an
        older job of the same name (the cached one may be stale); None when
        its folder is gone.
        """
        con = self._connect()
        try:
            con.execute("BEGIN IMMEDIATE")
            rows = con.execute(
                "SELECT * FROM jobs WHERE name = ? AND (state IS NULL OR state NOT IN (?, ?, ?))",
                (meta["name"], *_DONE),
            ).fetchall()
            for row in rows:
                state = current_state(dict(row))
                if state is None:
                    con.execute("DELETE FROM jobs WHERE id=?", (row["id"],))
                    continue
                con.execute("UPDATE jobs SET state=?, updated=? WHERE id=?", (state, time.time(), row["id"]))
                if state not in _DONE:
                    con.execute("ROLLBACK")
                    raise NameInUse(
                        f"a job named {meta['name']!r} is still running (id {row['id']}, "
                        f"folder {row['path']}); wait for it, cancel it "
                        f"(elsewhere cancel {meta['name']}), or choose another name"
                    )
            con.execute(
                "INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?)",
                (meta["id"], meta["name"], str(path), json.dumps(meta["cluster"]), meta.get("user"),
                 meta.get("tag"), meta.get("created"), meta.get("n_tasks", 0), "queued", time.time()),
            )
            con.execute("COMMIT")
        finally:
            con.close()

    def set_state(self, job_id: str, state: str, n_tasks: int | None = None) -> None:
        """Cache a job's state."""
        con = self._connect()
        try:
            if n_tasks is None:
                con.execute("UPDATE jobs SET state=?, updated=? WHERE id=?", (state, time.time(), job_id))
            else:
                con.execute("UPDATE jobs SET state=?, n_tasks=?, updated=? WHERE id=?",
                            (state, n_tasks, time.time(), job_id))
        finally:
            con.close()

    def remove(self, job_id: str) -> None:
        """Forget a job."""
        con = self._connect()
        try:
            con.execute("DELETE FROM jobs WHERE id=?", (job_id,))
        finally:
            con.close()

    def find(self, name_or_id: str) -> list[dict[str, Any]]:
        """Jobs whose id or name matches, newest first."""
        con = self._connect()
        try:
            rows = con.execute(
                "SELECT * FROM jobs WHERE id = ? OR name = ? ORDER BY created DESC",
                (name_or_id, name_or_id),
            ).fetchall()
        finally:
            con.close()
        return [dict(r) for r in rows]

    def all(self) -> list[dict[str, Any]]:
        """Every registered job, oldest first."""
        con = self._connect()
        try:
            rows = con.execute("SELECT * FROM jobs ORDER BY created").fetchall()
        finally:
            con.close()
        return [dict(r) for r in rows]
