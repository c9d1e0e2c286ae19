"""The file format of a job's queue: its state as JSON in two slots (``queue.json``,
``queue.b.json``), each written in place with a generation and a checksum (see
:func:`write_queue`), so that a write torn by a crash leaves the state before it whole in the
other slot. The state itself and its transitions are ``queue.py``'s.

This module is imported by the worker: keep its imports light.
"""

from __future__ import annotations

import json
import os
import zlib

TYPE_CHECKING = False  # no typing at run time: the worker imports this module
if TYPE_CHECKING:
    from typing import Any, Protocol

    class JobStore(Protocol):  # what the queue uses of a store (store.py imports this module)
        dir: str
        _held: tuple[int, int, int] | None

        def _p(self, *parts: str) -> str: ...


__all__ = ["QUEUE", "QUEUE_B", "QUEUE_LOCK", "read_queue", "write_queue"]

QUEUE = "queue.json"
QUEUE_B = "queue.b.json"  # the queue's second slot (see write_queue)
QUEUE_LOCK = "queue.lock"


def json_bytes(obj: Any) -> bytes:
    """``obj`` as compact JSON."""
    return json.dumps(obj, separators=(",", ":"), default=str).encode()


_QUEUE_MAGIC = b"EWQ1"


def write_queue(store: JobStore, q: dict[str, Any], gen: int, slot: int) -> None:
    """Write queue state ``q`` as generation ``gen`` into ``slot`` (0: queue.json, 1: queue.b.json).

    The queue is rewritten at every claim, join and leave, always under
    queue.lock. It is written *in place*, into the slot that does not hold the
    newest state, as one line ``EWQ1 <generation> <length> <crc32>`` and the
    JSON; a reader takes the newest slot whose checksum holds. A write torn by
    a crash leaves the other slot, the state before it, to be read; a reader
    without the lock that meets a slot being written does the same. No file is
    created or renamed per update (on many disks that costs more than the rest
    of a claim).
    """
    write_slot(store, json_bytes(q), gen, slot)


def write_slot(store: JobStore, body: bytes, gen: int, slot: int) -> None:
    """Write the JSON ``body`` as generation ``gen`` into ``slot`` (see :func:`write_queue`)."""
    data = b"%s %d %d %08x\n%s" % (_QUEUE_MAGIC, gen, len(body), zlib.crc32(body), body)
    held = store._held
    fd = (
        held[1 + slot]
        if held
        else os.open(store._p(QUEUE_B if slot else QUEUE), os.O_WRONLY | os.O_CREAT, 0o600)
    )
    try:
        view = memoryview(data)
        off = 0
        while off < len(data):
            off += os.pwrite(fd, view[off:], off)
        os.ftruncate(fd, len(data))
    finally:
        if not held:
            os.close(fd)


def _pread_all(fd: int) -> bytes:
    data = os.pread(fd, 65536, 0)
    if len(data) < 65536:
        return data
    parts = [data]
    off = len(data)
    while chunk := os.pread(fd, 1 << 20, off):
        parts.append(chunk)
        off += len(chunk)
    return b"".join(parts)


def _generation(data: bytes) -> int:
    """The generation a slot's header says (its body unchecked); -1 if it has no header."""
    if data[:1] == b"{":
        return 0
    head = data[: data.find(b"\n")].split()
    try:
        return int(head[1]) if len(head) == 4 and head[0] == _QUEUE_MAGIC else -1
    except ValueError:
        return -1


def _parse_slot(data: bytes) -> tuple[int, dict[str, Any], bytes] | None:
    """(generation, state, JSON body) of one slot's bytes; None if not whole."""
    if data[:1] == b"{":  # a plain JSON file (job folders from before the slots)
        try:
            return 0, json.loads(data), b""
        except ValueError:
            return None
    nl = data.find(b"\n")
    head = data[:nl].split() if nl > 0 else []
    if len(head) != 4 or head[0] != _QUEUE_MAGIC:
        return None
    try:
        gen, length, crc = int(head[1]), int(head[2]), int(head[3], 16)
        body = data[nl + 1 : nl + 1 + length]
        if len(body) != length or zlib.crc32(body) != crc:
            return None
        return gen, json.loads(body), body
    except ValueError:
        return None


def read_newest(store: JobStore) -> tuple[int, int, dict[str, Any], bytes]:
    """(generation, slot, state, JSON body) of the newest whole queue state; FileNotFoundError if none.
    The slot whose header says it is newer is checked and decoded first: the other only if that
    one is not whole (torn by a crash, or being written)."""
    slots: list[tuple[int, int, bytes]] = []
    held = store._held
    for slot, name in ((0, QUEUE), (1, QUEUE_B)):
        if held:
            data = _pread_all(held[1 + slot])
        else:
            try:
                fd = os.open(store._p(name), os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                data = _pread_all(fd)
            finally:
                os.close(fd)
        slots.append((_generation(data), slot, data))
    if not slots:
        raise FileNotFoundError(store._p(QUEUE))
    if len(slots) == 2 and slots[1][0] > slots[0][0]:
        slots.reverse()
    for _, slot, data in slots:
        got = _parse_slot(data)
        if got is not None:
            return got[0], slot, got[1], got[2]
    raise ValueError(f"the queue of job folder {store.dir} is damaged (no slot whole)")


def read_queue(store: JobStore) -> tuple[int, int, dict[str, Any]]:
    """(generation, slot, state) of the newest whole queue state; FileNotFoundError if none."""
    gen, slot, q, _ = read_newest(store)
    return gen, slot, q
