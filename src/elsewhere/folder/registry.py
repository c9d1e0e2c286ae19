"""The registry of jobs: name -> job folder, cached state.

A SQLite file in the home folder (``<home>/registry.sqlite``), in WAL mode
with a busy timeout, so two processes submitting at once both succeed and
never corrupt it. The job folder stays the source of truth; the registry
only finds folders and caches their last known state. Hence:

- a damaged file (not a database, a malformed page) is moved aside
  (``registry.sqlite.damaged-<time>-<pid>``) and the registry rebuilt from the
  job folders it can find (``<home>/jobs``, and the storage locations of the
  rows still readable in the damaged file), with one warning; a registry that is
  missing is made anew from ``<home>/jobs`` the same way, silently;
- the file is made (or remade) under ``registry.lock`` (flock), one process
  at a time, and whole under another name before it is renamed into place
  (:mod:`.registryfile`): no process opens one half made;
- the cached state is only a cache: when it cannot be written (a full disk),
  reads still work (read-only, if SQLite cannot even make its shared-memory
  file), and a row whose folder is gone is dropped from listings;
- the file and its ``-wal`` and ``-shm`` are mode 0600, whatever the umask.

A process keeps one connection per thread and registry file (closing the
last connection of a WAL database checkpoints it, which costs more than the
queries of a whole job); it is opened again after a fork, or when the file
was replaced or removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ..util import paths
from ..util.errors import JobError, NameInUse
from . import registryfile

log = logging.getLogger(__name__)

_DONE = ("finished", "failed", "cancelled")
_BUSY_S = registryfile.BUSY_S
_DAMAGED = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB: the file is no (sound) database
_SIDE_FILES = registryfile.SIDE_FILES

_local = threading.local()  # .cons: {path: (pid, inode, connection)}

T = TypeVar("T")


class _Borrowed:
    """A connection handed out for one call; ``close()`` keeps a cached one open and closes
    one made for the call (``owned``)."""

    def __init__(self, con: sqlite3.Connection, owned: bool = False) -> None:
        self._con = con
        self._owned = owned

    def execute(self, *args: Any) -> sqlite3.Cursor:
        return self._con.execute(*args)

    def executemany(self, *args: Any) -> sqlite3.Cursor:
        return self._con.executemany(*args)

    def close(self) -> None:
        if self._con.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # then _run forgets the connection
                self._con.execute("ROLLBACK")
        if self._owned:
            with contextlib.suppress(sqlite3.Error):
                self._con.close()


def _size(path: Path) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _damaged(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says the file is not a sound registry (rather than busy or full)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _DAMAGED:
        return True
    return isinstance(exc, sqlite3.DatabaseError) and (
        "not a database" in str(exc) or "malformed" in str(exc) or "no such table: jobs" in str(exc)
    )


class Registry:
    """Access to the job registry."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else paths.registry_path()
        self._lock_path = self.path.with_suffix(".lock")
        self._jobs = self.path.parent / "jobs"  # the home's job folders: a rebuild scans them
        self._held = threading.local()  # .depth: this thread holds registry.lock (re-entrant)

    # -- connections ------------------------------------------------------
    def _connect(self) -> _Borrowed:
        if threading.current_thread() is not threading.main_thread():
            # Other threads come and go (an Executor's, housekeeping's): a connection of
            # theirs, cached, would outlive them, and SQLite keeps the file descriptor of one
            # closed while another of the process is open until that one closes too: each
            # call of theirs has its own, whose descriptor the next one reuses.
            return _Borrowed(self._open(), owned=True)
        key = str(self.path)
        cons = getattr(_local, "cons", None)
        if cons is None:
            cons = _local.cons = {}
        inode = _inode(self.path)
        cached = cons.get(key)
        if cached is not None:
            pid, ino, con = cached
            if pid == os.getpid() and ino == inode and inode is not None:
                return _Borrowed(con)
            self._forget()
        for other in [k for k in cons if k != key]:  # one registry at a time per thread: another
            pid, _ino, old = cons.pop(other)  # home (a test's, a user's switch) closes the last
            if pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):
                    old.close()
        con = self._open()
        cons[key] = (os.getpid(), _inode(self.path), con)  # (None: moved aside meanwhile, opened again)
        return _Borrowed(con)

    def _forget(self) -> None:
        """Drop this thread's cached connection to the file (closed if it is this process's)."""
        cached = getattr(_local, "cons", {}).pop(str(self.path), None)
        if cached is not None and cached[0] == os.getpid():
            with contextlib.suppress(sqlite3.Error):
                cached[2].close()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold ``registry.lock`` (re-entrant within a thread): making the file, switching it
        to WAL and replacing a damaged one happen under it, one process and thread at a time
        (a flock belongs to an open file, so two opens exclude each other in one process too)."""
        depth = getattr(self._held, "depth", 0)
        if depth:
            self._held.depth = depth + 1
            try:
                yield
            finally:
                self._held.depth = depth
            return
        import fcntl

        fd = paths.private_file(self._lock_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._held.depth = 1
            try:
                yield
            finally:
                self._held.depth = 0
        finally:
            os.close(fd)  # releases the flock

    def _open(self) -> sqlite3.Connection:
        paths.private_dir(self.path.parent, fix=True)
        # mode=rw: connecting never makes the file (it would, empty, where a repair had just
        # moved the damaged one aside, and this process would use it alone): see registryfile
        uri = self.path.absolute().as_uri() + "?mode=rw"
        for _ in range(5):
            if not _size(self.path):  # none yet (a new home, or removed), or left empty
                self._remake(uri)
            else:
                self._close_files()
            try:
                con = sqlite3.connect(uri, uri=True, timeout=_BUSY_S, isolation_level=None)
            except sqlite3.OperationalError:
                if os.path.exists(self.path):
                    raise
                continue  # moved aside meanwhile (a repair): made again
            try:
                con.row_factory = sqlite3.Row
                con.execute("PRAGMA synchronous=NORMAL")
                if con.execute("PRAGMA user_version").fetchone()[0] >= 1:
                    return con
            except BaseException:
                con.close()
                raise
            con.close()
            self._remake(uri)
        raise sqlite3.OperationalError("the file was replaced each time it was opened")

    def _remake(self, uri: str) -> None:
        """A registry that is missing (a new home, or removed), empty (cut, about to be
        written), or made by an older version (no ``user_version``): made whole, from the job
        folders and its rows, and renamed into place (see :mod:`.registryfile`), unless it is
        sound by the time this process holds the lock. Never switched to WAL in place: that
        waits for every other connection to it, this lock held."""
        with self._locked():
            if _size(self.path):
                con = sqlite3.connect(uri, uri=True, timeout=_BUSY_S, isolation_level=None)
                try:  # (damaged by now: the caller's repair moves it aside)
                    if con.execute("PRAGMA user_version").fetchone()[0] >= 1:
                        return
                finally:
                    con.close()
            kept = registryfile.salvage(self.path)  # (none from a file missing or empty)
            registryfile.make(self.path, [*registryfile.scan({self._jobs}), *kept])

    def _close_files(self) -> None:
        """A registry made by an older version (or another umask) may be readable by others:
        make it and its side files 0600."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return  # moved aside meanwhile (a repair): made again, 0600
        if st.st_mode & 0o077 and st.st_uid == os.getuid():
            for suffix in ("", *_SIDE_FILES):
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(f"{self.path}{suffix}", 0o600)

    def _run(self, op: Callable[[_Borrowed], T], what: str, *, read: bool = False) -> T:
        """``op(connection)``; a damaged file is replaced by a rebuilt one and ``op`` runs again.
        Other SQLite errors become :class:`JobError` naming the file and ``what`` failed. A
        ``read`` that cannot open the file as usual (a full disk: SQLite cannot make its
        shared-memory file) reads it read-only."""
        repaired = False
        for attempt in range(3):
            inode = _inode(self.path)
            try:
                con = self._connect()
                try:
                    return op(con)
                finally:
                    con.close()
            except sqlite3.Error as exc:
                self._forget()  # the next call starts on a fresh connection
                if attempt < 2 and _inode(self.path) != inode:
                    continue  # replaced meanwhile (another process repaired it): the new one
                if not repaired and _damaged(exc):
                    repaired = True
                    try:
                        self._repair(exc, inode)
                    except (OSError, sqlite3.Error) as again:
                        raise JobError(f"the job registry {self.path} is damaged ({exc}) and cannot be "
                                       f"rebuilt: {again}") from again  # fmt: skip
                    continue
                if read:
                    with contextlib.suppress(sqlite3.Error):
                        return self._read_only(op)
                raise JobError(f"the job registry {self.path} cannot {what}: {exc}") from exc
            except OSError as exc:
                raise JobError(f"the job registry {self.path} cannot {what}: {exc}") from exc
        raise JobError(f"the job registry {self.path} cannot {what}: it was replaced again and again")

    def _read_only(self, op: Callable[[_Borrowed], T]) -> T:
        """``op`` on a read-only connection: one that needs no shared-memory file of its own if
        it can have one, else one that reads the file as it is (``immutable``: it misses only
        what a live connection of another process has not yet written back from the WAL)."""
        uri = self.path.absolute().as_uri()
        con = sqlite3.connect(uri + "?mode=ro", uri=True, timeout=_BUSY_S, isolation_level=None)
        try:
            con.row_factory = sqlite3.Row
            return op(_Borrowed(con))
        except sqlite3.OperationalError:
            pass
        finally:
            con.close()
        con = sqlite3.connect(uri + "?immutable=1", uri=True, isolation_level=None)
        try:
            con.row_factory = sqlite3.Row
            return op(_Borrowed(con))
        finally:
            con.close()

    # -- the damaged file ---------------------------------------------------
    def _repair(self, exc: sqlite3.Error, inode: int | None) -> None:
        """Move the damaged file aside and rebuild the registry from the job folders (unless
        another process did already: the file is not the one found damaged any more)."""
        with self._locked():
            self._forget()
            if inode is None or _inode(self.path) != inode:
                return  # replaced meanwhile, by another process or thread
            kept = registryfile.salvage(self.path)
            roots = {self._jobs, *(Path(r[2]).parent for r in kept)}
            rows = [*registryfile.scan(roots), *kept]  # (a folder's own row wins)
            aside = Path(f"{self.path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            for suffix in ("", *_SIDE_FILES):
                with contextlib.suppress(FileNotFoundError):
                    os.rename(f"{self.path}{suffix}", f"{aside}{suffix}")
            registryfile.make(self.path, rows)
            n = len({r[0] for r in rows})
        log.warning("elsewhere: the job registry %s was damaged (%s); moved it to %s and rebuilt it from "
                    "%d job folder(s) in %s", self.path, exc, aside, n,
                    ", ".join(sorted(map(str, roots))))  # fmt: skip

    # -- the jobs -----------------------------------------------------------
    def add(
        self,
        meta: dict[str, Any],
        path: Path,
        current_state: Callable[[dict[str, Any]], str | None],
    ) -> None:
        """Register a job; raise NameInUse if a running job has the same name.

        ``current_state(row)`` reads, from the job folder, the state of an
        older job of the same name (the cached one may be stale); None when
        its folder is gone. It is asked before the registry is locked for the
        write (for a batch or ssh job it asks the cluster, which can take
        seconds, and every other process would wait for the lock meanwhile);
        a job of that name registered in between is looked at in turn.
        """
        name, me = meta["name"], meta["id"]
        query = "SELECT * FROM jobs WHERE name = ? AND id != ? AND (state IS NULL OR state NOT IN (?, ?, ?))"

        def others(con: _Borrowed) -> list[dict[str, Any]]:
            return [dict(r) for r in con.execute(query, (name, me, *_DONE)).fetchall()]

        states: dict[str, str | None] = {}  # (a state only moves on: a job ended stays ended)

        def op(con: _Borrowed) -> bool:
            con.execute("BEGIN IMMEDIATE")
            rows = others(con)
            if any(row["id"] not in states for row in rows):
                con.execute("ROLLBACK")
                return False  # registered meanwhile: its state is asked first, unlocked
            for row in rows:
                state = states[row["id"]]
                if state is None:
                    con.execute("DELETE FROM jobs WHERE id=?", (row["id"],))
                    continue
                con.execute(
                    "UPDATE jobs SET state=?, updated=? WHERE id=?", (state, time.time(), row["id"])
                )
                if state not in _DONE:
                    con.execute("ROLLBACK")
                    raise NameInUse(
                        f"a job named {name!r} is still running (id {row['id']}, "
                        f"folder {row['path']}); wait for it, cancel it "
                        f"(elsewhere cancel {name}), or choose another name"
                    )
            con.execute(  # or replace: a rebuild from the folders may have found this job already
                "INSERT OR REPLACE INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?)",
                (me, name, str(path), json.dumps(meta["cluster"]), meta.get("user"),
                 meta.get("tag"), meta.get("created"), meta.get("n_tasks", 0), "queued", time.time()),
            )  # fmt: skip
            con.execute("COMMIT")
            return True

        for _ in range(10):
            for row in self._run(others, "be read", read=True):
                if row["id"] not in states:
                    states[row["id"]] = current_state(row)
            if self._run(op, f"register job {name!r}"):
                return
        raise JobError(f"the job registry {self.path} cannot register job {name!r}: other jobs of that name "
                       "were registered each time it looked")  # fmt: skip

    def set_state(self, job_id: str, state: str, n_tasks: int | None = None) -> None:
        """Cache a job's state; a cache that cannot be written (a full disk) is left as it was."""

        def op(con: _Borrowed) -> None:
            if n_tasks is None:
                con.execute(
                    "UPDATE jobs SET state=?, updated=? WHERE id=?", (state, time.time(), job_id)
                )
            else:
                con.execute("UPDATE jobs SET state=?, n_tasks=?, updated=? WHERE id=?",
                            (state, n_tasks, time.time(), job_id))  # fmt: skip

        try:
            self._run(op, "cache a state")
        except JobError as exc:
            log.debug("%s", exc)

    def remove(self, job_id: str) -> None:
        """Forget a job. If the registry cannot be written (a full disk), the row stays, and
        listings drop it once the job's folder is gone."""
        try:
            self._run(
                lambda con: con.execute("DELETE FROM jobs WHERE id=?", (job_id,)), "forget a job"
            )
        except JobError as exc:
            log.warning("elsewhere: %s (listings leave the job out once its folder is gone)", exc)

    def find(self, name_or_id: str) -> list[dict[str, Any]]:
        """Jobs whose id or name matches, newest first."""
        rows = self._run(
            lambda con: con.execute(
                "SELECT * FROM jobs WHERE id = ? OR name = ? ORDER BY created DESC",
                (name_or_id, name_or_id),
            ).fetchall(),
            "be read",
            read=True,
        )
        return [dict(r) for r in rows]

    def all(self) -> list[dict[str, Any]]:
        """Every registered job, oldest first; a job whose folder is gone (purged) is left out
        and forgotten, but not one whose storage location is missing (a file system not
        mounted now)."""
        rows = [
            dict(r)
            for r in self._run(
                lambda con: con.execute("SELECT * FROM jobs ORDER BY created").fetchall(),
                "be read",
                read=True,
            )
        ]
        gone = [r["id"] for r in rows if _gone(r["path"])]
        if gone:
            with contextlib.suppress(JobError):  # a cache: forgetting them can wait
                self._run(lambda con: con.executemany("DELETE FROM jobs WHERE id=?", [(i,) for i in gone]),
                          "forget purged jobs")  # fmt: skip
        return [r for r in rows if r["id"] not in gone]

    def ids(self) -> set[str]:
        """The ids of every registered job (what a sweep of the job folders asks)."""
        rows = self._run(lambda con: con.execute("SELECT id FROM jobs").fetchall(), "be read", read=True)
        return {str(r[0]) for r in rows}


def _gone(path: str) -> bool:
    """The job folder ``path`` is gone while its storage location is there."""
    return not os.path.lexists(path) and os.path.isdir(os.path.dirname(path))
