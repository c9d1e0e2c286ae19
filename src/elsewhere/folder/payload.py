"""Writing and reading ``payload.log``: the function, job data and task inputs.

The client appends chunks; workers read them. A chunk holds the inputs of a
run of consecutive tasks as one pickle (zstd-compressed where the job folder
travels to other machines) plus the large
buffers (NumPy arrays) out of band, so 100 000 tasks are about a hundred
chunks, and a 100 MB array is written from the caller's memory and read
into the worker's without passing through a pickle.

A task's entry is ``(fn, args, kwargs)``; ``fn`` is None when the task uses
the job's common function (``map``/``submit``), and a function of its own
for tasks added one by one (``add_task``, ``Executor.submit``).
"""

from __future__ import annotations

import bisect
import os

from . import records, serial
from .records import ChunkHeader, ChunkKind

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

TaskEntry = tuple  # (fn or None, args tuple, kwargs dict)

_NO_KWARGS: dict = {}
_TAGS = {"entries": "e", "args": "a", "single": "1"}  # how a chunk of tasks is stored
_TARGET_CHUNK_BYTES = 512 * 1024
_MAX_CHUNK_TASKS = 4096


class PayloadWriter:
    """Appends chunks to a job's payload (the client is the only writer)."""

    def __init__(self, path: str | os.PathLike[str], *, compress: bool = True) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.compress = compress  # False where the folder never travels: zstd would only cost time

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> PayloadWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, kind: ChunkKind, first: int, count: int, obj: Any) -> None:
        data, bufs = serial.dumps(obj)
        compressed = serial.compress(data, level=1 if len(data) > 1 << 20 else 3) if self.compress else data
        head = records.pack_chunk_head(kind, first, count, compressed, bufs)
        from .store import writev_all

        writev_all(self.fd, [head, compressed, *bufs])

    def write_common(self, fn: Any, job_data: Any) -> None:
        """Write the function and the job data shared by every task."""
        self._write(ChunkKind.COMMON, 0, 0, (fn, job_data))

    def write_tasks(self, first: int, entries: list[Any], *, form: str = "entries") -> int:
        """Write the inputs of tasks ``first ..``; returns how many chunks.

        ``entries`` are ``(fn, args, kwargs)`` triples (``form="entries"``), or
        for tasks that use the common function, argument tuples (``"args"``) or
        single arguments (``"single"``: ``map(f, xs)`` needs no tuple per task).
        """
        if not entries:
            return 0
        tag = _TAGS[form]
        # Size chunks by a sample, so that tiny inputs share a chunk and huge
        # ones get one each.
        sample = entries[: min(16, len(entries))]
        data, bufs = serial.dumps(sample)
        per_task = max(1, (len(data) + sum(b.nbytes for b in bufs)) // len(sample))
        k = max(1, min(_MAX_CHUNK_TASKS, _TARGET_CHUNK_BYTES // per_task))
        chunks = 0
        for start in range(0, len(entries), k):
            part = entries[start : start + k]
            self._write(ChunkKind.TASKS, first + start, len(part), (tag, part))
            chunks += 1
        return chunks


def common_check(path: str) -> int | None:
    """The checksum of the function and job data the tasks of the payload ``path`` share (its
    first chunk), read from its header alone; None if it has none or cannot be read (missing,
    still being written, damaged: whoever reads it for its tasks says why). The same in two
    jobs, the same function and job data."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        head = records.read_chunk_header(lambda offset, n: os.pread(fd, n, offset), 0)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return head.check if head is not None and head.kind is ChunkKind.COMMON else None


class PayloadReader:
    """Reads chunks on demand, keeping the last one decoded (workers).

    Every chunk is checked against its checksums before it is unpickled: a damaged one is a
    :class:`~elsewhere.util.errors.DamagedJob` naming ``payload.log`` and the task asked
    for; a chunk whose header is damaged is skipped to the next whole one (see
    ``records.py``), so the damage costs only the tasks it held.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._said: set[str] = set()
        try:
            self.fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if not os.path.exists(os.path.join(os.path.dirname(self.path), "job.json")):
                raise  # the job folder is gone (purged): not damage
            raise self._fail("it is missing") from None
        self._scanned = 0
        self._firsts: list[int] = []
        self._heads: list[ChunkHeader] = []
        self._common: ChunkHeader | None = None
        self._cached: tuple[int, str, list[Any]] | None = None
        self.damage: list[tuple[int, int, str]] = []  # (start, end, what) of the bytes skipped

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _read_at(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, n, offset)

    def _scan(self) -> None:
        while True:
            try:
                head = records.read_chunk_header(self._read_at, self._scanned)
            except ValueError as exc:
                if not self._skip(self._scanned, str(exc)):
                    return
                continue
            if head is None:
                return
            if os.fstat(self.fd).st_size < head.end:
                return  # still being written
            if head.kind is ChunkKind.COMMON:
                self._common = head
            else:
                self._firsts.append(head.first)
                self._heads.append(head)
            self._scanned = head.end

    def _skip(self, start: int, what: str) -> bool:
        """Damage at ``start``: go on at the next chunk whose header holds. False when none
        is found (yet): reading goes on from there when the file grows."""
        size = os.fstat(self.fd).st_size
        pos = start + 1
        while True:
            pos = self._next_magic(pos, size)
            if pos >= size:
                break
            try:
                head = records.read_chunk_header(self._read_at, pos)
            except ValueError:
                pos += 1
                continue
            if head is not None and head.end > size:
                head = None  # a whole header, its chunk being written
            self._note_damage(start, pos, what)
            self._scanned = pos
            return head is not None
        self._note_damage(start, pos, what)
        self._scanned = pos
        return False

    def _next_magic(self, pos: int, size: int) -> int:
        """The offset of the next chunk magic at or after ``pos`` (or of its first bytes at
        the end of the file); ``size`` if none."""
        block = 1 << 20
        while pos < size:
            data = self._read_at(pos, block + 3)
            found = [i for i in (data.find(m) for m in records.PAYLOAD_MAGICS) if i >= 0]
            if found:
                return pos + min(found)
            if len(data) <= block:
                for k in range(max(0, len(data) - 3), len(data)):
                    if any(m.startswith(data[k:]) for m in records.PAYLOAD_MAGICS):
                        return pos + k
                return size
            pos += block
        return size

    def _note_damage(self, start: int, end: int, what: str) -> None:
        if end > start:
            if self.damage and self.damage[-1][1] == start:
                start = self.damage.pop()[0]
            self.damage.append((start, end, what))

    def _damage_text(self) -> str:
        a, b, what = self.damage[0]
        more = f" (and {len(self.damage) - 1} more damaged spans)" if len(self.damage) > 1 else ""
        return f"{what} at bytes {a}..{b} skipped{more}"

    def _fail(self, what: str, task: int | None = None) -> Exception:
        """The DamagedJob of ``what`` (for ``task``), said once in the job's damage log."""
        if what not in self._said:
            self._said.add(what)
            note_damage(os.path.dirname(self.path), f"damaged: payload.log: {what}")
        return _damaged(what, task)

    def _load(self, head: ChunkHeader, task: int | None) -> Any:
        what = ("the job's function and data" if head.kind is ChunkKind.COMMON
                else f"the chunk of tasks {head.first}..{head.first + head.count - 1} at byte {head.offset}")
        compressed = self._read_at(head.data_off, head.data_len)
        bufs = []
        pos = head.data_off + head.data_len
        for n in head.buf_lens:
            buf = bytearray(n)
            got = os.preadv(self.fd, [buf], pos) if n else 0
            if got != n:
                raise self._fail(f"{what} is cut short", task)
            bufs.append(buf)
            pos += n
        if len(compressed) != head.data_len:
            raise self._fail(f"{what} is cut short", task)
        if not head.holds(compressed, bufs):
            raise self._fail(f"checksum mismatch ({what})", task)
        return serial.loads(serial.decompress(compressed), bufs)

    def common(self) -> tuple[Any, Any]:
        """(function, job data) shared by every task; (None, None) if absent."""
        if self._common is None:
            self._scan()
        if self._common is None:
            if self.damage:
                raise self._fail(f"the job's function and data are not found: {self._damage_text()}")
            return None, None
        fn, job_data = self._load(self._common, None)
        return fn, job_data

    def common_check(self) -> int | None:
        """The checksum of the function and job data the tasks share, once read (see
        :func:`common_check`); None before, or if the job has none."""
        return self._common.check if self._common is not None else None

    def _chunk(self, index: int) -> tuple[int, str, list[Any]]:
        """(first task, tag, entries) of the chunk holding ``index``: the last one is kept."""
        cached = self._cached
        if cached is not None and cached[0] <= index < cached[0] + len(cached[2]):
            return cached
        pos = bisect.bisect_right(self._firsts, index) - 1
        if pos < 0 or index >= self._heads[pos].first + self._heads[pos].count:
            self._scan()
            pos = bisect.bisect_right(self._firsts, index) - 1
        if pos < 0 or index >= self._heads[pos].first + self._heads[pos].count:
            if self.damage:
                raise self._fail(f"its inputs are not found: {self._damage_text()}", index)
            size = os.fstat(self.fd).st_size
            inside = f" inside a chunk at byte {self._scanned}" if size > self._scanned else ""
            raise self._fail(f"its inputs are not in it (it ends{inside} at {size} bytes: cut short?)", index)
        head = self._heads[pos]
        tag, part = self._load(head, index)
        self._cached = (head.first, tag, part)
        return self._cached

    def forget(self) -> None:
        """Let go of the chunk kept (its tasks' arguments): a worker that waits for work holds
        nothing of the calls it ran."""
        self._cached = None

    def task(self, index: int) -> TaskEntry:
        """The entry ``(fn, args, kwargs)`` of task ``index``."""
        first, tag, part = self._chunk(index)
        if tag == "a":  # argument tuples only: the common function, no keywords
            return None, part[index - first], _NO_KWARGS
        if tag == "1":  # one argument each
            return None, (part[index - first],), _NO_KWARGS
        return part[index - first]

    def args_run(self, index: int) -> tuple[int, list[Any], bool] | None:
        """(first task, arguments, whether each is a single argument rather than a
        tuple) of the chunk holding ``index``, if its tasks all use the common
        function with positional arguments only; else None (also when the chunk is
        damaged: the tasks are then run, and fail, one by one)."""
        from ..util.errors import DamagedJob

        try:
            first, tag, part = self._chunk(index)
        except DamagedJob:
            return None
        if tag == "e":
            return None
        return first, part, tag == "1"


def _damaged(what: str, task: int | None = None) -> Exception:
    from ..util.errors import DamagedJob

    return DamagedJob("payload.log", what, task=task)


#: Lines that a reader of the job folder appends when it finds a file damaged that it does
#: not write (a worker reading the payload): ``JobHandle.damage`` shows them.
DAMAGE_LOG = "damage.txt"


def note_damage(folder: str, line: str) -> None:
    """Append ``line`` to the damage log of the job folder ``folder`` (one whole ``write`` with
    O_APPEND: lines from several workers do not mix). Best effort."""
    try:
        fd = os.open(os.path.join(folder, DAMAGE_LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        os.write(fd, (line.replace("\n", " ")[:1000] + "\n").encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def read_damage(folder: str) -> list[str]:
    """The lines of the damage log of the job folder ``folder``, each once, in order."""
    try:
        with open(os.path.join(folder, DAMAGE_LOG), "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return []
    return list(dict.fromkeys(x for x in data.decode("utf-8", "replace").splitlines() if x.strip()))
