"""Folder work kept off the path of a submission: spare job folders, removals.

Creating a file or a folder is the slowest thing a submission does on many
disks (0.3 to 1 ms each on a virtual disk with a journalling file system,
and a new job folder needs about eight), and removing a purged job folder
costs as much again. So a client process

- takes a *spare* job folder, made ahead of time with its subfolders, lock
  and FIFO, under ``<storage>/.spare/``, by renaming it into place (one
  atomic rename; any process of the user may take a spare, only one
  succeeds), and makes the next spare in a background thread;
- removes a purged job folder in the background once it has been renamed
  away (the rename is what makes the job gone; see ``lifecycle.remove_folder``); or,
  where its storage holds fewer than ``SPARES_KEPT`` spares, makes it the next spare:
  emptied, its files made anew (new files: a process that still holds one of the old
  ones open cannot write into the next job; but for its lock, FIFO and job.json, which such
  a process cannot harm: see ``KEPT``), which costs the disk about a third of removing it
  and building a spare (a loop of ``ew.map`` calls makes no folder at all);
- purges the job an ``ew.map`` call returned the values of (on the local backend: see
  ``api/functions.py``), after it returned them;
- makes a submitted job's ``job.json`` and ``payload.log`` durable (fsync)
  in the background, ``SYNC_DELAY_S`` after the submission: a job must survive a
  crash of the machine, but its workers do not wait for the disk to start, and a
  short job purged before then (an ``ew.map`` of tiny tasks) costs the disk no sync
  at all (its files are gone: there is nothing to keep).

Whatever the background thread had not done when the process ends is done
at exit, once the thread has done what it was doing; folders left by a process that was
killed (``.<id>.purged-*``, ``.spare/.building-*``) are swept by the next process that makes
a spare, and other sweeps run once per process in the background (:func:`call_later`: the folders of jobs
whose client was killed inside ``submit``, see ``core/submit.py``).

Telling a full disk and a live process, which the background work needs too, is
``util/system.py``'s (:func:`~elsewhere.util.system.is_disk_full`, ``no_space``,
``process_alive``).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..util.system import process_alive

SPARES = ".spare"
SUBDIRS = ("journal", "results", "logs", "workers")
QUEUE_LOCK = "queue.lock"
NOTIFY = "notify.fifo"
META = "job.json"
#: made empty ahead of time too: the client writes into them (creating a file is the cost)
FILES = (QUEUE_LOCK, META, "queue.json", "queue.b.json", "payload.log")
#: ... of which a purged folder made a spare keeps these (job.json emptied): nobody holds
#: job.json open, and a process of the purged job that still holds the lock or the FIFO only
#: takes the lock a moment or wakes the next job's client for nothing. The queue's slots, the
#: payload and the workers' files, which such a process reads or writes, are made new.
KEPT = {QUEUE_LOCK: stat.S_IFREG, META: stat.S_IFREG, NOTIFY: stat.S_IFIFO}

_lock = threading.Lock()
_todo: list[tuple[str, Any]] = []  # (kind, a path; for "call" and "soon", a function; for "later", a key)
_wake = threading.Condition(_lock)
_thread: threading.Thread | None = None
_thread_pid = 0
_swept: set[Path] = set()
_called: set[str] = set()
_busy = 0  # hot sections running now (see hot())
_DEFER_MAX_S = 1.0  # ... which hold the housekeeping back at most this long
SYNC_DELAY_S = 1.0  # a submitted job's inputs are made durable this long after (see above)
SPARES_KEPT = 2  # a purged folder is made a spare while its storage holds fewer than this
_GRAVE = ".purged-"  # in the name of a job folder renamed away by a purge (see grave_name)
_OLD_S = 3600.0  # a grave or a half-built spare this old was left by a process that died
_doing: list[tuple[str, Any]] = []  # what the thread is doing now (finish() waits for it)
_FINISH_WAIT_S = 60.0
_due: dict[Any, float] = {}  # when each sync or later call of _todo is due (time.monotonic())
_calls: dict[str, Callable[[], object]] = {}  # the calls of later(), by key


class hot:
    """``with housekeeping.hot():`` the client is submitting or reading results: the
    background work waits (its syscalls and the GIL would slow each step of it) until
    the client waits on its workers, or for at most _DEFER_MAX_S."""

    def __enter__(self) -> None:
        global _busy
        with _lock:
            _busy += 1

    def __exit__(self, *exc: object) -> None:
        global _busy
        with _lock:
            _busy -= 1
            if not _busy and _todo:
                _wake.notify()


def make_job_folder(path: Path) -> None:
    """Make an empty job folder at ``path``: a spare renamed into place, or a new one."""
    spares = path.parent / SPARES
    for name in _ready(spares) or ():
        try:
            os.rename(spares / name, path)
            break
        except OSError:
            continue  # another process took it first
    else:
        _build(path)
    _later("spare", path.parent)


def _ready(spares: str | Path) -> list[str] | None:
    """The names of the spares ready in the folder ``spares`` (not those half built); None
    if there is no such folder."""
    try:
        names = os.listdir(spares)
    except FileNotFoundError:
        return None
    return [n for n in names if not n.startswith(".")]


def _building(spares: str | Path) -> str:
    """A name in ``spares`` to make a spare under (swept only an hour on, see _sweep)."""
    return os.path.join(spares, f".building-{os.getpid()}-{os.urandom(4).hex()}")


def _publish(building: str, spares: str | Path) -> None:
    """The spare made under ``building`` is ready: any process may take it now."""
    os.rename(building, os.path.join(spares, os.urandom(6).hex()))


def call_later(key: str, fn: Callable[[], object]) -> None:
    """Call ``fn`` in the background, once per ``key`` in this process (a sweep)."""
    with _lock:
        if key in _called:
            return
        _called.add(key)
    _later("call", fn)


def soon(fn: Callable[[], object]) -> None:
    """Call ``fn`` in the background once the client is not busy, or at exit at the latest
    (``ew.map``'s purge of the job it read: the call returns its values first)."""
    _later("soon", fn)


def later(key: str, fn: Callable[[], object]) -> None:
    """Call ``fn`` in the background ``SYNC_DELAY_S`` from now, unless :func:`drop` of ``key``
    comes first; at exit at the latest (an ``ew.map`` job registered once it has run that long:
    see ``core/submit.py``)."""
    with _lock:
        _calls[key] = fn
        _due[key] = time.monotonic() + SYNC_DELAY_S
    _later("later", key)


def drop(key: str) -> bool:
    """Forget the call of :func:`later` for ``key``: True if it was not made (nor begun)."""
    with _lock:
        if _calls.pop(key, None) is None:
            return False
        _due.pop(key, None)
        if ("later", key) in _todo:
            _todo.remove(("later", key))
        return True


def drain() -> None:
    """Make the calls of :func:`soon` not made yet now, in this thread (a listing of jobs
    would show a job an ``ew.map`` of this process returned from, purged in the background)."""
    while True:
        with _lock:
            todo = [t for t in _todo if t[0] == "soon"]
            for t in todo:
                _todo.remove(t)
        if not todo:
            return
        for kind, fn in todo:
            _do(kind, fn)


def remove_later(path: Path, was: Path | None = None) -> None:
    """Remove ``path`` (already renamed away from where anyone looks) in the background, or
    make it a spare (a purged job folder: see above). The syncs queued for ``was``, its name
    before, are dropped: nothing of it is left to keep."""
    if was is not None:
        with _lock:
            for t in [t for t in _todo if t[0] == "sync" and t[1].parent == was]:
                _todo.remove(t)
                _due.pop(t[1], None)
    _later("remove", path)


def grave_name(folder: str) -> str:
    """The name a purge renames the job folder named ``folder`` to: ``.<folder>.purged-<pid>-<ns>-<host>``,
    so that a sweep knows whether the process that purged it still runs (see :func:`_sweep`)."""
    return f".{folder}{_GRAVE}{os.getpid()}-{time.monotonic_ns()}-{os.uname().nodename}"


def _abandoned(name: str, changed: float, now: float) -> bool:
    """Whether the grave ``name`` (renamed there at ``changed``, its ctime) was left by a
    process that ended: one of this machine that does not run, or any, an hour on."""
    if now - changed > _OLD_S:
        return True
    pid, _, rest = name.rpartition(_GRAVE)[2].partition("-")
    host = rest.partition("-")[2]  # (none in the names of earlier versions: this machine's)
    if host and host != os.uname().nodename:
        return False  # another machine's, on a shared storage: it may still be removing it
    return not (pid.isdigit() and process_alive(int(pid)))


def sync_later(folder: Path, names: tuple[str, ...]) -> None:
    """Make ``folder/name`` for each name, and ``folder`` itself, durable (fsync) in the
    background, ``SYNC_DELAY_S`` from now (at exit at the latest); nothing if it is gone by then."""
    spec = folder / "\0".join(names)
    with _lock:
        _due[spec] = time.monotonic() + SYNC_DELAY_S
    _later("sync", spec)


def _sync(spec: Path) -> None:
    folder, names = spec.parent, spec.name.split("\0")
    for name in (*names, "."):
        try:
            fd = os.open(folder / name, os.O_RDONLY)
        except OSError:
            continue  # purged meanwhile
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def _build(path: Path) -> None:
    path.mkdir(mode=0o700)
    for sub in SUBDIRS:
        (path / sub).mkdir(mode=0o700)
    _fill(str(path))


def _fill(folder: str, kept: frozenset[str] = frozenset()) -> None:
    """The empty files of a job folder, and its FIFO, made new (but those ``kept``)."""
    for name in FILES:
        if name not in kept:
            os.close(os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    if NOTIFY not in kept:
        os.mkfifo(os.path.join(folder, NOTIFY), 0o600)


def _remove(path: Path, *, recycle: bool = True) -> None:
    """Remove ``path``; or, a purged job folder whose storage has fewer than SPARES_KEPT
    spares, make it one."""
    if not (recycle and _GRAVE in path.name and _recycled(path)):
        shutil.rmtree(path, ignore_errors=True)


def _recycled(grave: Path) -> bool:
    """Make the purged job folder ``grave`` a spare, where its storage has fewer than
    SPARES_KEPT; True if it is gone from where it was (a spare now, or removed)."""
    spares = grave.parent / SPARES
    try:
        ready = _ready(spares)
    except OSError:
        return False
    if ready is None or len(ready) >= SPARES_KEPT:
        return False  # (None: a storage that makes no spares)
    building = _building(spares)
    try:
        os.rename(grave, building)  # out of the sweep's way first
    except OSError:
        return False
    try:
        _fill(building, _empty(building))
        _publish(building, spares)
    except OSError:
        shutil.rmtree(building, ignore_errors=True)
    return True


def _as_made(st: os.stat_result, kind: int = stat.S_IFDIR) -> bool:
    """Whether ``st`` (not followed) is of a file of ``kind`` as this module makes them: ours,
    0700 for a folder, 0600 for anything else."""
    mode = 0o700 if kind == stat.S_IFDIR else 0o600
    return stat.S_IFMT(st.st_mode) == kind and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == mode


def _empty(folder: str) -> frozenset[str]:
    """Empty a job folder down to its subfolders and the files it keeps (:data:`KEPT`, as
    :func:`_build` made them: job.json cut to nothing), having checked that it and its
    subfolders are as made (a task may have changed what it found there: a link in place of
    a subfolder is not followed); OSError if not. Returns the names kept."""
    if not _as_made(os.lstat(folder)):
        raise OSError(errno.ENOTDIR, "not a job folder as built", folder)
    with os.scandir(folder) as it:
        entries = list(it)
    subs = [e for e in entries if e.name in SUBDIRS]
    if len(subs) != len(SUBDIRS) or not all(_as_made(e.stat(follow_symlinks=False)) for e in subs):
        raise OSError(errno.ENOTDIR, "not a job folder as built", folder)
    kept = []
    for e in entries:
        if e.name in SUBDIRS:
            continue
        if e.name in KEPT and _as_made(e.stat(follow_symlinks=False), KEPT[e.name]):
            if e.name == META:
                fd = os.open(e.path, os.O_WRONLY | os.O_NOFOLLOW)
                try:
                    os.ftruncate(fd, 0)
                finally:
                    os.close(fd)
            kept.append(e.name)
        else:
            _unlink(e)
    for e in subs:
        with os.scandir(e.path) as inner:
            for f in inner:
                _unlink(f)
    return frozenset(kept)


def _unlink(entry: os.DirEntry[str]) -> None:
    if entry.is_dir(follow_symlinks=False):
        shutil.rmtree(entry.path)
    else:
        os.unlink(entry.path)


def _make_spare(root: Path) -> None:
    spares = root / SPARES
    ready = _ready(spares)
    if ready:
        return
    if ready is None:
        spares.mkdir(mode=0o700, exist_ok=True)
    if root not in _swept:
        _swept.add(root)
        _sweep(root)
    building = _building(spares)
    try:
        _build(Path(building))
        _publish(building, spares)
    except OSError:
        shutil.rmtree(building, ignore_errors=True)


def _sweep(root: Path) -> None:
    """Remove what killed processes left: purged folders (not those of a process that
    runs: it may be making one a spare), spares half built an hour ago (by their ctime,
    which their rename there set: a purged folder being made a spare is one, its mtime
    that of its job's last change)."""
    now = time.time()
    for base, pick in ((root, _GRAVE), (root / SPARES, ".building-")):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            if name.startswith(".") and pick in name:
                p = base / name
                try:
                    st = p.stat()
                    if _abandoned(name, st.st_ctime, now) if pick == _GRAVE else now - st.st_ctime > _OLD_S:
                        shutil.rmtree(p, ignore_errors=True)
                except OSError:
                    pass


def _later(kind: str, path: Any) -> None:
    global _thread, _thread_pid
    with _lock:
        if kind == "spare" and ("spare", path) in _todo:
            return
        idle = not _todo  # (the thread then waits without a timeout)
        _todo.append((kind, path))
        if _thread is None or _thread_pid != os.getpid():  # none yet, or we are a fork's child
            _thread_pid = os.getpid()
            _thread = threading.Thread(target=_run, name="elsewhere-housekeeping", daemon=True)
            _thread.start()
        if idle or not _busy:  # (else, in a hot section, the thread looks again by itself)
            _wake.notify()


def _run() -> None:
    while True:
        with _lock:
            until = None
            while True:  # the lock is let go while waiting: finish() may empty the list meanwhile
                if not _todo:
                    until = None
                    _wake.wait()
                    continue
                if until is None:
                    until = time.monotonic() + _DEFER_MAX_S
                left = until - time.monotonic()
                if not _busy or left <= 0:
                    break
                _wake.wait(left)
            # a spare first: the next submission waits for it, syncs and removals wait for no one
            # (a sync until it is due)
            now = time.monotonic()
            pick = next((t for t in _todo if t[0] == "spare"), None) or next(
                (t for t in _todo if t[0] not in ("sync", "later") or _due.get(t[1], 0.0) <= now), None)
            if pick is None:
                _wake.wait(max(0.0, min(_due.get(t[1], now) for t in _todo) - now))
                continue
            kind, path = pick
            _due.pop(path, None)
            if kind in ("soon", "later"):
                _todo.remove(pick)  # taken: drain() and finish() must not make the call again
            _doing.append(pick)
        try:
            _do(kind, path)
        finally:
            with _lock:
                _doing.clear()
                if (kind, path) in _todo:
                    _todo.remove((kind, path))
                _wake.notify_all()  # (finish() may wait for it)


def _do(kind: str, path: Any, *, recycle: bool = True) -> None:
    try:
        if kind in ("call", "soon"):
            path()
        elif kind == "remove":
            _remove(path, recycle=recycle)
        elif kind == "sync":
            _sync(path)
        elif kind == "later":
            with _lock:
                fn = _calls.pop(path, None)
            if fn is not None:
                fn()
        else:
            _make_spare(path)
    except Exception:
        pass  # housekeeping never fails a job; the sweep catches up


def finish() -> None:
    """Do what is still to be done, now (at exit: purges, syncs and removals; no new spares,
    no sweeps), once the thread has done what it is doing (up to :data:`_FINISH_WAIT_S`): a
    process that ended while its thread made a purged folder a spare left that folder whole
    under ``.spare/.building-*``, results and all, for the sweep an hour later."""
    if _thread is not None and _thread_pid == os.getpid() and _thread is not threading.current_thread():
        with _lock:
            # (not for a sweep, which may take long, and leaves nothing half done)
            _wake.wait_for(lambda: not _doing or _doing[0][0] == "call", _FINISH_WAIT_S)
    while True:  # (a purge queues a removal)
        with _lock:
            todo = [t for t in _todo if t[0] not in ("spare", "call")]
            _todo.clear()
            _due.clear()
        if not todo:
            return
        todo.sort(key=lambda t: t[0] != "soon")
        for kind, path in todo:
            _do(kind, path, recycle=False)


def _after_fork_in_child() -> None:
    """A forked child (a local worker started as a fork of its client, see
    ``hosts/forkstart.py``) starts with nothing to do and its own lock: the thread of the
    parent is not in it, and may have held the lock at the fork."""
    global _lock, _wake, _thread, _todo, _busy
    _lock = threading.Lock()
    _wake = threading.Condition(_lock)
    _thread, _todo, _busy = None, [], 0
    _doing.clear()
    _due.clear()
    _calls.clear()


FORK_SAFE_THREAD = "elsewhere-housekeeping"
"""The name of the thread here: it holds nothing that a forked child needs (see above)."""

os.register_at_fork(after_in_child=_after_fork_in_child)

import atexit  # noqa: E402

atexit.register(finish)
