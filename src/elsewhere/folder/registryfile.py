"""The registry's file: made whole under another name and renamed into place, found again
from the job folders, salvaged when damaged (see :mod:`.registry`, which calls these under
``registry.lock``).

A registry is never made where other processes can open it: one that opened a file still
being made (switched to WAL, its schema not yet written) could take it for damaged and move
it aside under its maker, or, as the last connection to close, remove the WAL its maker is
writing (SQLite's "disk I/O error" in either process). So :func:`make` writes the whole file
(WAL, schema, rows) as ``registry.sqlite.new-<pid>``, closes it (which writes the WAL back
and removes it) and renames it into place: a process sees no registry, or the old one, or
the new one whole.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..util import paths

log = logging.getLogger(__name__)

SCHEMA = """
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

SIDE_FILES = ("-wal", "-shm")
BUSY_S = 60.0  # how long a statement waits for another process's lock


def make(path: Path, rows: Iterable[tuple[Any, ...]]) -> None:
    """Put a new registry holding ``rows`` at ``path`` (where there is none, or one to be
    replaced: moved aside first by the caller), made whole under another name first."""
    new = Path(f"{path}.new-{os.getpid()}")
    for suffix in ("", *SIDE_FILES):  # left by a process of this pid killed while making one
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{new}{suffix}")
    # Made 0600 before SQLite opens it: it gives -wal and -shm the same mode.
    os.close(paths.private_file(new, os.O_WRONLY))
    try:
        con = sqlite3.connect(new, timeout=BUSY_S, isolation_level=None)
        try:  # (no other process has it open: the switch to WAL waits for none)
            con.execute("PRAGMA journal_mode=WAL").fetchone()  # (it sticks to the file)
            con.executescript(SCHEMA)
            con.execute("BEGIN IMMEDIATE")
            # the first row of an id wins: a job folder's own before one salvaged
            con.executemany("INSERT OR IGNORE INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
            con.execute("PRAGMA user_version = 1")
            con.execute("COMMIT")
        finally:
            con.close()  # the only connection: the WAL is written back and removed
        for suffix in SIDE_FILES:  # a vanished database's side files would be replayed into the new one
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
        os.rename(new, path)
    except BaseException:
        for suffix in ("", *SIDE_FILES):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{new}{suffix}")
        raise


def salvage(path: Path) -> list[tuple[Any, ...]]:
    """The rows still readable in a damaged registry whose job folders are there (best effort:
    usually none; they tell where jobs outside ``<home>/jobs`` are)."""
    kept: list[tuple[Any, ...]] = []
    try:
        con = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return kept
    try:
        for row in con.execute("SELECT * FROM jobs"):
            if len(row) == 10 and isinstance(row[2], str) and os.path.isdir(row[2]):
                kept.append((*row[:8], None, time.time()))
    except sqlite3.Error:
        pass
    finally:
        con.close()
    return kept


def scan(roots: set[Path]) -> Iterator[tuple[Any, ...]]:
    """A registry row for each submitted job folder under ``roots`` (state unknown: the next
    listing reads it from the folder)."""
    from .store import JobStore

    for root in roots:
        try:
            names = sorted(os.listdir(root))
        except OSError:
            continue
        for name in names:
            if name.startswith("."):
                continue  # spares, folders being purged
            folder = root / name
            try:
                meta = JobStore(folder).meta()
                # (the queue, not job.json: ew.submit writes job.json's "submitted" before the payload)
                if not isinstance(meta, dict) or not JobStore(folder).queue().submitted:
                    continue  # never submitted, or made by a client killed before it registered the job
                yield (str(meta["id"]), str(meta["name"]), str(folder), json.dumps(meta["cluster"]),
                       meta.get("user"), meta.get("tag"), meta.get("created"), meta.get("n_tasks") or 0,
                       None, time.time())  # fmt: skip
            except Exception as exc:  # a damaged folder must not stop the others
                log.debug("registry rebuild: skipped %s: %s", folder, exc)
