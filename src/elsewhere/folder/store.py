"""The job folder: the single source of truth about a job.

Layout (``docs/job-folder.md`` explains each file)::

    <job>/job.json            metadata; written by the client, atomically
    <job>/payload.log         function, job data and task inputs, in chunks
    <job>/queue.json          which tasks are claimed, by whom; under queue.lock
    <job>/queue.lock          flock(2) guard of queue.json
    <job>/cluster.json        the backend's own data (scheduler ids, hosts, pids)
    <job>/journal/<w>.rec     per-worker append-only journal of task outcomes
    <job>/results/<w>.bin     per-worker result bodies the journal points into
    <job>/logs/<w>.log        per-worker captured stdout+stderr
    <job>/workers/<w>.json    who a worker given its tasks is (host, pid, python); others: queue.json
    <job>/workers/<w>.cur     the task a worker runs now (shared memory, see worker.py)
    <job>/notify.fifo         a worker writes a byte here after new results
    <job>/files/              files attached with ``files=``

Every file has one writer, or is guarded by ``queue.lock``. Whole-file
writes go to a temporary name and are renamed; appends are whole,
checksummed frames.

Here: whole-file writes and reads (``atomic_write``, ``write_json``, ...),
:class:`JobStore` (the queue file and its state are ``queue.py``'s). The
journals, result bodies and logs are read and written in ``journal.py``.

This module is imported by the worker: keep its imports light.
"""

from __future__ import annotations

import json
import os
import struct

from . import records
from .queue import QUEUE, QUEUE_B, QUEUE_LOCK, LockedQueue, Queue, new_queue, read_queue
from .records import Record

TYPE_CHECKING = False  # neither typing nor pathlib at run time: the worker imports this module
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

META = "job.json"
PAYLOAD = "payload.log"
CLUSTER = "cluster.json"
NOTIFY = "notify.fifo"
CONTROL = "_control"  # pseudo-worker id of records written by reapers and cancel
CONTROL_ID = "control-id"  # in a copy of a job folder on another host: the id its control records go under


def is_control(wid: str) -> bool:
    """Whether journal ``wid`` holds records written by reapers and cancels, not a worker's:
    ``_control`` here, ``_control.<id>`` in a copy of the folder on another host (its reapers write
    under a name of their own, so that the copies brought back never overwrite one another)."""
    return wid == CONTROL or wid.startswith(CONTROL + ".")

CUR = struct.Struct("<qdq")  # task now running (-1: none), since (unix time), its log offset
SEVERAL = -2  # CUR's task while a process runs (a flood's loop), loads or pickles for several tasks at once


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def atomic_write(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` via a temporary file and a rename."""
    path = os.fspath(path)
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str).encode()


def write_json(path: str | os.PathLike[str], obj: Any, *, fsync: bool = True, sealed: bool = False) -> None:
    """Atomically write ``obj`` as JSON (``sealed``: a dict, with its checksum: ``records.seal_json``)."""
    data = _json_bytes(obj)
    atomic_write(path, records.seal_json(data) if sealed else data, fsync=fsync)


def write_new(path: str | os.PathLike[str], obj: Any, *, sealed: bool = False) -> None:
    """Write ``obj`` as JSON in place, no temporary file, no rename: for a file that no
    one reads before it is whole (one of a job folder being made, a worker's own info).

    Cut to its length after the write, not opened with O_TRUNC: ext4 takes a file cut to
    nothing and written again for one replaced in place, and writes it back when it is
    closed (``auto_da_alloc``): a close of 20 us to a millisecond on a virtual disk, where
    the empty files of a spare job folder (``housekeeping.py``) cost nothing."""
    data = _json_bytes(obj)
    if sealed:
        data = records.seal_json(data)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        _write_all(fd, data)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file."""
    with open(path, "rb") as f:
        return json.loads(f.read())


def read_sealed(path: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """Read a JSON object written with ``sealed=True``, checked (one written before there
    were seals is taken as it is); :class:`~elsewhere.util.errors.DamagedJob` naming the
    file (``name``: ``job.json``) if it is cut, garbage or its checksum does not hold."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        obj = json.loads(records.open_json(raw))
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        return obj
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError too
        from ..util.errors import DamagedJob

        what = str(exc) if str(exc).startswith(("checksum", "not a")) else "not whole JSON (cut or garbage)"
        raise DamagedJob(name, "the file is empty" if not raw else what) from None


def writev_all(fd: int, parts: list[bytes | memoryview]) -> None:
    """Write all ``parts`` to ``fd`` (handles short writes and the iovec limit)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        n = os.writev(fd, views[:512])
        while n:
            first = views[0]
            if n >= first.nbytes:
                n -= first.nbytes
                views.pop(0)
            else:
                views[0] = first[n:]
                n = 0


def job_gone(folder: str) -> Exception:
    """The error of a job whose folder is gone (purged): JobGone, naming the job's id."""
    from ..util.errors import JobGone  # here: the worker rarely needs it

    return JobGone(f"job {os.path.basename(folder)} is gone: its folder {folder} was purged")


def queue_damaged(exc: ValueError) -> Exception:
    """The DamagedJob of a queue whose two slots are both damaged (``exc``: as queue.py says it)."""
    from ..util.errors import DamagedJob

    if isinstance(exc, DamagedJob):
        return exc
    return DamagedJob(f"{QUEUE} and {QUEUE_B}", "neither holds a whole queue state")


class _JobQueueLock(LockedQueue):
    """``store.locked_queue()``: a LockedQueue that tells a job purged under it (its folder
    renamed away, see ``lifecycle.remove_folder``) with JobGone, not the FileNotFoundError
    of whichever of its files was opened first."""

    __slots__ = ()

    def __enter__(self) -> Queue:
        try:
            q = super().__enter__()
        except FileNotFoundError as exc:
            if os.path.isdir(self.store.dir):
                raise
            raise job_gone(self.store.dir) from exc
        except ValueError as exc:  # neither slot whole
            raise queue_damaged(exc) from None
        if not self.body and not os.path.isdir(self.store.dir):  # purged between the lock and the read
            self._release()
            raise job_gone(self.store.dir)
        return q

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            super().__exit__(exc_type, *rest)
        except FileNotFoundError as exc:
            if os.path.isdir(self.store.dir):
                raise
            raise job_gone(self.store.dir) from exc


class JobStore:
    """Access to one job folder."""

    _held: tuple[int, int, int] | None = None
    seen_submitted = False  # a queue state read or written here said "submitted" (never unset)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.dir = os.fspath(path)

    def hold_queue(self) -> None:
        """Keep queue.lock and the queue's two slots open until ``release_queue`` (a
        worker inside the job: a claim is then a lock, two reads and a write)."""
        if self._held is None:
            fds: list[int] = []
            try:
                for name in (QUEUE_LOCK, QUEUE, QUEUE_B):
                    fds.append(os.open(self._p(name), os.O_RDWR))
            except BaseException:
                for fd in fds:
                    os.close(fd)
                raise
            self._held = (fds[0], fds[1], fds[2])

    def release_queue(self) -> None:
        held, self._held = self._held, None
        for fd in held or ():
            os.close(fd)

    _path: Path | None = None

    @property
    def path(self) -> Path:
        """The job folder, as a Path (for the client; workers use ``dir``)."""
        if self._path is None:
            from pathlib import Path

            self._path = Path(self.dir)
        return self._path

    def _p(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    def __repr__(self) -> str:
        return f"JobStore({self.dir!r})"

    # -- creation ---------------------------------------------------------
    @classmethod
    def create(cls, path: Path, meta: dict[str, Any]) -> JobStore:  # client only
        """Make a new job folder (mode 0700) with its metadata."""
        from ..util.paths import private_dir
        from . import housekeeping

        private_dir(path.parent)  # its missing parents 0700 too, whatever the umask
        housekeeping.make_job_folder(path)  # subfolders, queue.lock, notify.fifo, empty files
        store = cls(path)
        write_new(path / META, meta, sealed=True)  # made durable when the job is submitted
        return store

    # -- metadata ---------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        """The job's metadata (DamagedJob if job.json is damaged)."""
        return read_sealed(self._p(META), META)

    def update_meta(self, *, fsync: bool = True, **changes: Any) -> dict[str, Any]:
        """Change metadata fields (the client is the only writer)."""
        meta = self.meta()
        meta.update(changes)
        write_json(self._p(META), meta, fsync=fsync, sealed=True)
        return meta

    def cluster_data(self) -> dict[str, Any]:
        """What the backend stored with ``set_job_cluster_data``."""
        try:
            return read_sealed(self._p(CLUSTER), CLUSTER)
        except FileNotFoundError:
            return {}

    def set_cluster_data(self, data: dict[str, Any]) -> None:
        """Store the backend's own data (scheduler ids, hosts, pids)."""
        write_json(self._p(CLUSTER), data, sealed=True)

    # -- the queue ----------------------------------------------------------
    def locked_queue(self) -> LockedQueue:
        """The queue state under its lock (a :class:`~elsewhere.folder.queue.Queue`); changes,
        made by its transitions, are written back on exit::

            with store.locked_queue() as q:
                q.cancel_task(3)

        In a job folder purged meanwhile it raises :class:`~elsewhere.util.errors.JobGone`
        (a FileNotFoundError too, as a worker expects of a folder that went away).
        """
        return _JobQueueLock(self)

    def queue(self) -> Queue:
        """A snapshot of the queue state (no lock: the file is replaced atomically)."""
        try:
            q = read_queue(self)[2]
        except FileNotFoundError:
            return Queue(new_queue(0))
        except ValueError as exc:  # neither slot whole
            raise queue_damaged(exc) from None
        if q.get("submitted"):
            self.seen_submitted = True
        return Queue(q)

    def notify(self) -> None:
        """Wake a client waiting on this job, if any (never blocks)."""
        try:
            fd = os.open(self._p(NOTIFY), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return  # no reader (ENXIO) or no fifo: nobody waits
        try:
            os.write(fd, b"!")
        except OSError:
            pass  # full (EAGAIN): the reader is awake anyway
        finally:
            os.close(fd)

    # -- journals and results -----------------------------------------------
    def journal_path(self, wid: str) -> str:
        return self._p("journal", f"{wid}.rec")

    def results_path(self, wid: str) -> str:
        return self._p("results", f"{wid}.bin")

    def log_path(self, wid: str) -> str:
        return self._p("logs", f"{wid}.log")

    def workers(self) -> list[str]:
        """Ids of every worker that has written a journal."""
        try:
            names = os.listdir(self._p("journal"))
        except FileNotFoundError:
            return []
        return [n[:-4] for n in names if n.endswith(".rec")]

    def append_control(self, recs: list[Record]) -> None:
        """Append records written by a reaper or by cancel (caller holds the queue lock), to
        ``journal/_control.rec``, or in a copy of the folder on another host to the journal
        its ``control-id`` names (see :func:`is_control`)."""
        wid = CONTROL
        try:
            with open(self._p(CONTROL_ID)) as f:
                named = f.read().strip()
            if is_control(named) and "/" not in named:
                wid = named
        except OSError:
            pass
        fd = os.open(self.journal_path(wid), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, records.pack_frame(recs))
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_running(self, wid: str) -> tuple[int, float, int]:
        """(task index, since, log offset) of what worker ``wid`` runs now; index -1 if none."""
        try:
            with open(self._p("workers", f"{wid}.cur"), "rb") as f:
                data = f.read(CUR.size)
        except FileNotFoundError:
            return -1, 0.0, 0
        if len(data) < CUR.size:
            return -1, 0.0, 0
        idx, since, log_off = CUR.unpack(data)
        return int(idx), float(since), int(log_off)

    def runs_task(self, wid: str, member: dict[str, Any], index: int) -> bool:
        """Whether worker ``wid`` (its queue entry ``member``) runs task ``index`` now, as far as
        its map tells: it names the task, or says SEVERAL (a flood's loop) while its claim holds it."""
        idx = self.read_running(wid)[0]
        return idx == index or (idx == SEVERAL and records.claim_holds(member.get("claim") or [], index))

    def worker_info(self, wid: str) -> dict[str, Any]:
        """Who worker ``wid`` is (host, pid, python): its queue member entry, or, for a
        worker given its tasks (no membership), ``workers/<wid>.json``."""
        try:
            return read_json(self._p("workers", f"{wid}.json"))
        except (FileNotFoundError, ValueError):
            pass
        try:
            member = self.queue().members.get(wid)
        except (OSError, ValueError):
            return {}
        return dict(member) if member else {}
