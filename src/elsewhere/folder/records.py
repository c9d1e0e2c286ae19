"""Binary formats of the job folder: journal records, result bodies, payload chunks.

Pure code (struct, zlib): no file handling beyond reading and writing bytes.

Journal: a sequence of frames, each a group of records written with one
``write``. Frame header: u32 magic 0x45574a31 ("EWJ1"), u32 record count,
u32 crc32 of the records that follow. A record (fixed size, little-endian)::

    offset size field
    0      1    kind        1 ok, 2 error, 3 lost, 4 cancelled
    1      1    flags       reserved, 0
    2      2    attempt     0 for the first run, +1 per retry
    4      4    task        0-based task index
    8      4    item        position of this task's value in the result body's list
    12     4    count       tasks this record covers: task .. task+count-1 (a range
                            record: fast tasks run as one batch, values at item ..)
    16     8    res_off     offset of the result body in the worker's results file
    24     8    res_len     length of the body
    32     8    log_off     offset of the task's output in the worker's log file
    40     8    log_len     length of that output (a range's: the whole batch's)
    48     8    t_start     unix time the task (range: the batch) started (float64)
    56     8    t_end       unix time it ended (float64)
    64     8    peak_rss    the worker's peak resident memory so far, bytes
    72     8    seed        the seed the task (range: the first task) ran with

Frames are written after the result bodies they point to; a reader stops at
the first frame that is short or whose checksum is wrong (a frame being
written), so it never sees half a result.

Result body: the values (or error descriptions) of a group of tasks that
finished close together, as one pickled list, so that ten thousand tiny
results are one pickle, not ten thousand::

    u32 magic 0x45575231 ("EWR1"), u32 number of out-of-band buffers n,
    u64 pickle length, n x u64 buffer lengths, u32 crc32 of the pickle,
    the pickle (protocol 5), then the buffers back to back.

Payload chunk (the tasks' inputs, in ``payload.log``)::

    u32 magic 0x45575031 ("EWP1"), u8 kind (1 common, 2 tasks), 3 pad bytes,
    u64 first task, u32 count, u32 n buffers, u64 compressed pickle length,
    n x u64 buffer lengths, u32 crc32 of the compressed pickle,
    zstd(pickle), buffers.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections import namedtuple

TYPE_CHECKING = False  # no typing at run time: the worker imports this module
if TYPE_CHECKING:
    from collections.abc import Iterator


class Kind(enum.IntEnum):
    """What a journal record says about its task."""

    OK = 1
    ERROR = 2
    LOST = 3
    CANCELLED = 4


_REC = struct.Struct("<BBHIIIqqqqddqq")
_FRAME = struct.Struct("<III")
_FRAME_MAGIC = 0x45574A31
RECORD_SIZE = _REC.size  # 80


class Record(namedtuple(
    "Record",
    "kind flags attempt task item count res_off res_len log_off log_len t_start t_end peak_rss seed",
    defaults=(0, 1, 0, 0, 0, 0, 0.0, 0.0, 0, 0),
)):
    """One journal record: the outcome of one run of one task (or a range, see ``count``).

    Fields as in the table above: kind (a :class:`Kind`), flags, attempt, task,
    item, count, res_off, res_len, log_off, log_len, t_start, t_end, peak_rss, seed.
    """

    __slots__ = ()
    kind: int
    flags: int
    attempt: int
    task: int
    item: int
    count: int
    res_off: int
    res_len: int
    log_off: int
    log_len: int
    t_start: float
    t_end: float
    peak_rss: int
    seed: int


def make_record(kind: Kind, task: int, attempt: int = 0, **fields: float) -> Record:
    """A record with the given fields, the others zero."""
    return Record(int(kind), 0, attempt, task, **fields)


def pack_frame(records: list[Record]) -> bytes:
    """A journal frame holding ``records``."""
    body = b"".join([_REC.pack(*r) for r in records])
    return _FRAME.pack(_FRAME_MAGIC, len(records), zlib.crc32(body)) + body


def parse_frames(data: bytes | bytearray | memoryview) -> tuple[list[Record], int]:
    """Parse whole, valid frames from ``data``.

    Returns their records and the number of bytes consumed; parsing stops at
    a short tail or at the first frame whose magic or checksum is wrong.
    """
    out: list[Record] = []
    view = memoryview(data)
    pos = 0
    n = len(view)
    make = Record._make
    while pos + _FRAME.size <= n:
        magic, count, crc = _FRAME.unpack_from(view, pos)
        end = pos + _FRAME.size + count * RECORD_SIZE
        if magic != _FRAME_MAGIC or end > n:
            break
        block = view[pos + _FRAME.size : end]
        if zlib.crc32(block) != crc:
            break
        out.extend(map(make, _REC.iter_unpack(block)))
        pos = end
    return out, pos


_CRC = struct.Struct("<I")


_RES_MAGIC = 0x45575231
_RES_HEAD = struct.Struct("<IIQ")


def pack_body(pickled: bytes, buffers: list[memoryview]) -> list[bytes | memoryview]:
    """The parts of a result body, ready for ``os.writev``."""
    head = _RES_HEAD.pack(_RES_MAGIC, len(buffers), len(pickled))
    lens = struct.pack(f"<{len(buffers)}Q", *(b.nbytes for b in buffers))
    return [head, lens, _CRC.pack(zlib.crc32(pickled)), pickled, *buffers]


def body_size(parts: list[bytes | memoryview]) -> int:
    """Total length of the parts of a body."""
    return sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)


def unpack_body(data: bytes | bytearray | memoryview) -> tuple[memoryview, list[memoryview]]:
    """Split a result body into its pickle and its out-of-band buffers.

    Raises ValueError on a damaged body.
    """
    view = memoryview(data)
    if len(view) < _RES_HEAD.size:
        raise ValueError("result body too short")
    magic, nbuf, plen = _RES_HEAD.unpack_from(view, 0)
    if magic != _RES_MAGIC:
        raise ValueError("result body has a wrong magic number")
    pos = _RES_HEAD.size
    lens = struct.unpack_from(f"<{nbuf}Q", view, pos)
    pos += 8 * nbuf
    (crc,) = _CRC.unpack_from(view, pos)
    pos += _CRC.size
    pickled = view[pos : pos + plen]
    if len(pickled) != plen or zlib.crc32(pickled) != crc:
        raise ValueError("result body is damaged (checksum)")
    pos += plen
    bufs = []
    for n in lens:
        bufs.append(view[pos : pos + n])
        pos += n
    if pos > len(view):
        raise ValueError("result body is truncated")
    return pickled, bufs


_PAY_MAGIC = 0x45575031
_PAY_HEAD = struct.Struct("<IB3xQIIQ")


class ChunkKind(enum.IntEnum):
    """What a payload chunk holds."""

    COMMON = 1  # the function, job data and run context shared by all tasks
    TASKS = 2  # the inputs of tasks first .. first+count-1


class ChunkHeader(namedtuple("ChunkHeader", "kind first count offset data_off data_len buf_lens crc")):
    """The header of one payload chunk, and where its parts lie in the file.

    kind (a :class:`ChunkKind`), first task, count, offset of the chunk,
    data_off and data_len of the compressed pickle, buf_lens, crc.
    """

    __slots__ = ()
    kind: ChunkKind
    first: int
    count: int
    offset: int
    data_off: int
    data_len: int
    buf_lens: tuple[int, ...]
    crc: int

    @property
    def end(self) -> int:
        """Offset just past this chunk."""
        return self.data_off + self.data_len + sum(self.buf_lens)


def pack_chunk_head(
    kind: ChunkKind, first: int, count: int, compressed: bytes, buffers: list[memoryview]
) -> bytes:
    """Header bytes (through the checksum) of a payload chunk."""
    head = _PAY_HEAD.pack(_PAY_MAGIC, int(kind), first, count, len(buffers), len(compressed))
    lens = struct.pack(f"<{len(buffers)}Q", *(b.nbytes for b in buffers))
    return head + lens + _CRC.pack(zlib.crc32(compressed))


def read_chunk_header(read_at: object, offset: int) -> ChunkHeader | None:
    """Parse the chunk header at ``offset`` via ``read_at(offset, n) -> bytes``.

    Returns None at the end of the file or on a short (still being written) header.
    """
    reader = read_at  # a callable; typed loosely to keep this module import-light
    head = reader(offset, _PAY_HEAD.size)  # type: ignore[operator]
    if len(head) < _PAY_HEAD.size:
        return None
    magic, kind, first, count, nbuf, dlen = _PAY_HEAD.unpack(head)
    if magic != _PAY_MAGIC:
        raise ValueError(f"payload damaged at offset {offset}")
    rest = reader(offset + _PAY_HEAD.size, 8 * nbuf + 4)  # type: ignore[operator]
    if len(rest) < 8 * nbuf + 4:
        return None
    lens = struct.unpack_from(f"<{nbuf}Q", rest, 0)
    (crc,) = _CRC.unpack_from(rest, 8 * nbuf)
    data_off = offset + _PAY_HEAD.size + 8 * nbuf + 4
    return ChunkHeader(ChunkKind(kind), first, count, offset, data_off, dlen, tuple(lens), crc)


def iter_ranges(claim: list[int]) -> Iterator[int]:
    """Task indices of a claim stored as ``[start, stop]`` or ``[-1, i, j, ...]``."""
    if claim and claim[0] == -1:
        yield from claim[1:]
    elif len(claim) == 2:
        yield from range(claim[0], claim[1])
