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


class PayloadReader:
    """Reads chunks on demand, keeping the last one decoded (workers)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        self._scanned = 0
        self._firsts: list[int] = []
        self._heads: list[ChunkHeader] = []
        self._common: ChunkHeader | None = None
        self._cached: tuple[int, str, list[Any]] | None = None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _read_at(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, n, offset)

    def _scan(self) -> None:
        while True:
            head = records.read_chunk_header(self._read_at, self._scanned)
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

    def _load(self, head: ChunkHeader) -> Any:
        compressed = self._read_at(head.data_off, head.data_len)
        import zlib

        if len(compressed) != head.data_len or zlib.crc32(compressed) != head.crc:
            raise ValueError(f"payload chunk at offset {head.offset} is damaged")
        bufs = []
        pos = head.data_off + head.data_len
        for n in head.buf_lens:
            buf = bytearray(n)
            got = os.preadv(self.fd, [buf], pos)
            if got != n:
                raise ValueError(f"payload chunk at offset {head.offset} is truncated")
            bufs.append(buf)
            pos += n
        return serial.loads(serial.decompress(compressed), bufs)

    def common(self) -> tuple[Any, Any]:
        """(function, job data) shared by every task; (None, None) if absent."""
        if self._common is None:
            self._scan()
        if self._common is None:
            return None, None
        fn, job_data = self._load(self._common)
        return fn, job_data

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
            raise IndexError(f"task {index} is not in the payload")
        head = self._heads[pos]
        tag, part = self._load(head)
        self._cached = (head.first, tag, part)
        return self._cached

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
        function with positional arguments only; else None."""
        first, tag, part = self._chunk(index)
        if tag == "e":
            return None
        return first, part, tag == "1"
