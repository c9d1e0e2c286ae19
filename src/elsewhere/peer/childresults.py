"""A task process's outcomes on their way to its daemon (the "results" message of
``childmsg.py``).

A group is the values of the tasks of a batch that ended since the last send (at most 10 ms
apart), pickled together as one list, like the result bodies of a local worker: one write and
one read per group, not per task (:class:`BatchResults`). A large value crosses in a warm memfd
of the task process (:class:`Leases`: reused once the daemon releases it, and kept mapped, so
the copy lands in pages that are already there), or, if it is (a view of) one of the batch's
own inputs, as a slice of that input, which the daemon still holds.
"""

from __future__ import annotations

import mmap
import os
import pickle
import sys
import time
from collections.abc import Callable
from typing import Any

from ..folder.errorrecord import ErrorRecord
from ..folder.store import SEVERAL
from ..run.results import dump_values, peak_rss
from ..run.runner import TaskOutcome
from .childmsg import GROUP_BYTES, MAX_FDS, OOB_MEMFD_BYTES, Outcome, send_message

__all__ = ["BatchResults", "Leases"]

_MAX_RESULT_OOB = 1000  # RESULT frames carry at most 1024 buffers: 2 + these
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_KEEP_OUT = 4  # warm result memfds a task process keeps for the next large result


class _Lease:
    """A warm memfd for large results, mapped for the life of the process."""

    def __init__(self, capacity: int) -> None:
        self.fd = os.memfd_create("elsewhere-result", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, capacity)
        self.mm = mmap.mmap(self.fd, capacity, flags=mmap.MAP_SHARED | _POPULATE)
        self.capacity = capacity
        self.free = True

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


class Leases:
    """The task process's warm memfds for large results."""

    def __init__(self) -> None:
        self.pool: dict[int, _Lease] = {}
        self._last_id = 0

    def lease(self, data: memoryview) -> tuple[int, int, int]:
        """A memfd holding a copy of ``data``: (fd, id, capacity). The fd stays the process's."""
        view = memoryview(data).cast("B")
        n = len(view)
        fits = [i for i, lease in self.pool.items() if lease.free and lease.capacity >= n]
        if fits:
            lid = min(fits, key=lambda i: self.pool[i].capacity)
            lease = self.pool[lid]
        else:
            self._last_id += 1
            lid = self._last_id
            lease = self.pool[lid] = _Lease(-(-n // (1 << 20)) << 20)
        lease.mm[:n] = view
        lease.free = False
        return lease.fd, lid, lease.capacity

    def release(self, ids: list[int]) -> None:
        """The daemon is done with these memfds: reuse (some of) them."""
        for lid in ids:
            lease = self.pool.get(lid)
            if lease is not None:
                lease.free = True
        free = [i for i, lease in self.pool.items() if lease.free]
        for lid in free[:-_KEEP_OUT] if len(free) > _KEEP_OUT else []:
            self.pool.pop(lid).close()


class BatchResults:
    """The outcomes of batch ``batch``, sent on ``sock`` in groups.

    ``error`` makes the error record of a task (by index) whose value cannot be pickled;
    ``maps`` are the batch's inputs in shared memory, ``(position, key, map)``; ``finish``
    adds to the header of the last message what the daemon learns once per batch.
    ``deliver``: where a message goes instead of ``sock`` (a lane's task process keeps its
    results: ``deliver(header, body, fds)``, large values in the body, not in memfds).
    """

    def __init__(self, sock: Any, batch: str, *, leases: Leases, error: Callable[[BaseException, int], ErrorRecord],
                 finish: Callable[[dict[str, Any]], None], maps: list[tuple[int, Any, mmap.mmap]] | None = None,
                 group_bytes: int = GROUP_BYTES, mark: Callable[[int], None] | None = None,
                 deliver: Callable[[dict[str, Any], list[Any], list[int]], None] | None = None) -> None:  # fmt: skip
        self.sock = sock
        self.deliver = deliver
        self.mark = mark  # tells the daemon which task a crash while pickling costs
        self.batch = batch
        self.leases = leases
        self.error = error
        self.finish = finish
        self.maps = maps or []
        self.group_bytes = group_bytes
        self._spans: list[tuple[int, int, int]] | None = None  # (position, address, size) of maps
        self.since = time.time()
        self.values: list[Any] = []
        self.items: list[list[Any]] = []  # [index, attempt, fate, item, t0, t1, rss, log length]
        self.runs: list[list[Any]] = []  # [first, count, item, t0, t1, rss]: successes without output
        self.logs: list[bytes] = []  # of the items
        self.oob = 0
        self.released: list[int] = []  # positions of the inputs the daemon may reuse

    def add(self, o: TaskOutcome, log: bytes) -> None:
        """Outcome ``o``, and the output kept of it."""
        status = Outcome.OK if o.ok else Outcome.ERROR
        self.items.append([o.index, o.attempt, int(status), len(self.values), o.t_start, o.t_end, 0, len(log)])
        self.values.append(o.value)
        self.logs.append(log)

    def add_run(self, first: int, values: list[Any], t0: float, t1: float, logs: dict[int, bytes]) -> None:
        """Tasks ``first``, ``first + 1``... (first attempts) returned ``values``, all between
        ``t0`` and ``t1``; ``logs`` holds the output of those that wrote some (by position)."""
        at, n = len(self.values), len(values)
        self.values += values
        start = 0  # the tasks between those with output: one entry each stretch
        for k in sorted(logs) if logs else ():
            if k > start:
                self.runs.append([first + start, k - start, at + start, t0, t1, 0])
            self.items.append([first + k, 0, 0, at + k, t0, t1, 0, len(logs[k])])
            self.logs.append(logs[k])
            start = k + 1
        if start < n:
            self.runs.append([first + start, n - start, at + start, t0, t1, 0])

    def _spread(self) -> None:
        """The runs as one item per task, the items in the order of their values (for the
        rarer paths that look at values one by one: a value that fails to pickle, a group
        sent in parts)."""
        if self.runs:
            logs = {item[3]: log for item, log in zip(self.items, self.logs, strict=True)}
            for first, count, at, t0, t1, rss in self.runs:
                self.items += [[first + k, 0, 0, at + k, t0, t1, rss, 0] for k in range(count)]
            self.runs = []
            self.items.sort(key=lambda item: item[3])
            self.logs = [logs.get(item[3], b"") for item in self.items]

    def _task_of(self, k: int) -> int:
        self._spread()
        return int(self.items[k][0])

    def _pickle(self) -> tuple[bytes, list[memoryview]]:
        if self.mark is not None and self.values:  # a death now costs this task, or none of several
            self.mark(int(self.items[0][0] if self.items else self.runs[0][0]) if len(self.values) == 1 else SEVERAL)
        if self.oob >= _MAX_RESULT_OOB:  # a RESULT carries at most 1024 buffers
            try:
                return pickle.dumps(self.values, protocol=5), []
            except BaseException:  # (dump_values makes the error of the value that fails)
                pass
        data, bufs, bad = dump_values(self.values, lambda k, exc: self.error(exc, self._task_of(k)))
        for k in bad:
            self.items[k][2] = int(Outcome.ERROR)
        return data, bufs

    def _within_input(self, data: memoryview) -> tuple[int, int] | None:
        """(position, offset) of ``data`` inside one of the batch's input maps, if it lies
        wholly in one: a result that is (a slice of) its argument needs no copy."""
        start = _address(data)
        if start is None:
            return None
        if self._spans is None:
            self._spans = []
            for position, _key, mm in self.maps:
                base = _address(mm)
                if base is not None:
                    self._spans.append((position, base, len(mm)))
        for position, base, size in self._spans:
            if base <= start and start + len(data) <= base + size:
                return position, start - base
        return None

    def send(self, *, last: bool) -> None:
        """Send the outcomes added since the last send (``last``: the batch is done)."""
        try:
            self._send(last=last)
        finally:
            if self.mark is not None:
                self.mark(-1)  # pickled: no task's any more

    def _send(self, *, last: bool) -> None:
        pickled = self._pickle() if self.values else None
        if pickled is None or len(self.values) < 2 or _size(pickled) <= self.group_bytes:
            self._send_group(pickled, last=last)
            return
        self._spread()
        # A large group goes in parts of at most group_bytes (a value larger goes alone):
        # the daemon replaces a group that cannot travel (a RESULT is one frame) by errors,
        # and then only for the values too large themselves.
        from ..folder import serial

        items, values, logs = self.items, self.values, self.logs
        sizes = []
        for value in values:
            try:
                sizes.append(_size(serial.dumps_plain([value])))
            except BaseException:
                sizes.append(0)  # it fails again below, and becomes an error there
        parts: list[list[int]] = [[]]
        total = 0
        for k, size in enumerate(sizes):
            if parts[-1] and total + size > self.group_bytes:
                parts.append([])
                total = 0
            parts[-1].append(k)
            total += size
        for n, part in enumerate(parts):
            self.items, self.values, self.logs = [items[k] for k in part], [values[k] for k in part], [
                logs[k] for k in part]  # fmt: skip
            for pos, item in enumerate(self.items):
                item[3] = pos
            self._send_group(self._pickle(), last=last and n == len(parts) - 1)

    def _send_group(self, pickled: tuple[bytes, list[memoryview]] | None, *, last: bool) -> None:
        header: dict[str, Any] = {"op": "results", "batch": self.batch, "items": self.items,
                                  "last": last, "group": None}  # fmt: skip
        body: list[Any] = []
        fds: list[int] = []
        if pickled is not None:
            data, bufs = pickled
            parts: list[list[int]] = []
            body.append(data)
            for b in bufs:
                within = self._within_input(b) if len(b) >= OOB_MEMFD_BYTES and self.maps else None
                if within is not None:  # a view of an input (returned as given, or changed
                    parts.append([len(b), 2, *within])  # in place): the daemon sends it from there
                elif len(b) >= OOB_MEMFD_BYTES and len(fds) < MAX_FDS and self.deliver is None:
                    fd, lid, capacity = self.leases.lease(b)
                    fds.append(fd)
                    parts.append([len(b), 1, lid, capacity])
                else:
                    body.append(b)
                    parts.append([len(b), 0])
            self.oob += len(bufs)
            header["group"] = [len(data), parts]
            rss = peak_rss()
            for item in self.items:
                item[6] = rss
            for r in self.runs:
                r[5] = rss
            if self.runs:
                header["runs"] = self.runs
            body.extend(self.logs)
        if last:
            header["released"] = self.released
            self.finish(header)
        if self.deliver is not None:
            self.deliver(header, body, fds)
        else:
            send_message(self.sock, header, body, fds)
        self.values, self.items, self.runs, self.logs = [], [], [], []
        self.since = time.time()


def _size(pickled: tuple[bytes, list[memoryview]]) -> int:
    return len(pickled[0]) + sum(memoryview(b).nbytes for b in pickled[1])


def _address(data: Any) -> int | None:
    """Where a contiguous buffer's bytes start in this process (None if it cannot be told)."""
    import ctypes

    try:
        holder = ctypes.c_char.from_buffer(data)  # a writable buffer
    except (TypeError, ValueError):
        np = sys.modules.get("numpy")  # read-only: NumPy, when loaded, reads any buffer
        if np is None:
            return None
        try:
            return int(np.frombuffer(data, dtype=np.uint8).ctypes.data)
        except (TypeError, ValueError):
            return None
    address = ctypes.addressof(holder)
    del holder  # the export ends here: the map can be released (resized) afterwards
    return address
