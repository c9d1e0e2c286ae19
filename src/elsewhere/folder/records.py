"""Binary formats of the job folder: journal records, result bodies, payload chunks, and the
checksummed JSON of ``job.json`` and ``cluster.json``.

Pure code (struct, zlib, xxhash): no file handling beyond reading and writing bytes. Every
body carries a checksum written with it: XXH3-64 (:func:`checksum`; about 7 GB/s here, against
2-3 GB/s for zlib's CRC32: ``bench/checksum.py``). This version writes format 2 (magics ending
in "2") and still reads format 1 (magics ending in "1", CRC32 over less of each body).

Journal: a sequence of frames, each a group of records written with one ``write``::

    offset size field
    0      4    magic       0x45574a32 ("EWJ2"; bytes 32 4a 57 45)
    4      4    count       records in the frame
    8      8    body hash   XXH3-64 of the records that follow
    16     8    head hash   XXH3-64 of bytes 0..15: the count is trusted only when it holds
    24     80 x count       the records

A record (fixed size, little-endian)::

    offset size field
    0      1    kind        1 ok, 2 error, 3 lost, 4 cancelled
    1      1    flags       1 single (the body is this task's value, not a list),
                            2 damaged (a lost record: the task's outcome was damaged),
                            4 rerun (an error record: the task runs again, ``retries=``;
                            this attempt's error is kept, not the task's outcome)
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

Frames are written after the result bodies they point to. :func:`scan_frames` reads them:

- a frame whose two hashes hold is read;
- too few bytes to tell (fewer than a header, or a header that holds but a frame that runs
  past the end) is a *tail*: a frame being written; reading stops there, to go on later;
- anything else (a head hash that does not hold, a body hash that does not hold, bytes that
  are not a frame) is *damage*: the reader looks for the next frame byte by byte (the next
  magic whose head hash holds) and reports the bytes it skipped. A frame is never taken
  from damaged bytes: the head hash is checked before its count is believed.

A format-1 frame (magic 0x45574a31, u32 count, u32 CRC32 of the records) is read too; it has
no head hash, so a count damaged to run past the end reads as a tail.

Result body: the values (or error descriptions) of a group of tasks that finished close
together, as one pickled list, so that ten thousand tiny results are one pickle::

    u32 magic 0x45575232 ("EWR2"), u32 number of out-of-band buffers n, u64 pickle length,
    n x u64 buffer lengths, u64 XXH3-64 of all of the above, the pickle and every buffer,
    then the pickle (protocol 5), then the buffers back to back.

(Format 1, "EWR1": a u32 CRC32 of the pickle alone; its buffers were not checked.)

Payload chunk (the tasks' inputs, in ``payload.log``)::

    u32 magic 0x45575032 ("EWP2"), u8 kind (1 common, 2 tasks), 3 pad bytes,
    u64 first task, u32 count, u32 n buffers, u64 compressed pickle length,
    n x u64 buffer lengths, u64 head hash (XXH3-64 of the header before it),
    u64 data hash (XXH3-64 of the compressed pickle and the buffers),
    zstd(pickle), buffers.

(Format 1, "EWP1": no head hash, a u32 CRC32 of the compressed pickle alone.) A chunk whose
head hash does not hold is skipped like a damaged journal frame: the next chunk is the next
magic whose head hash holds.

Checked JSON (``job.json``, ``cluster.json``): the object with one more key, last,
``"_check":"<16 hex digits>"``, the XXH3-64 of the object's JSON without it; still JSON for
any reader (:func:`seal_json`, :func:`open_json`).
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections import namedtuple

import xxhash

TYPE_CHECKING = False  # no typing at run time: the worker imports this module
if TYPE_CHECKING:
    from collections.abc import Iterator

_hash = xxhash.xxh3_64_intdigest
_Hasher = xxhash.xxh3_64


def checksum(*parts: bytes | bytearray | memoryview) -> int:
    """The XXH3-64 of ``parts`` one after another (each a contiguous buffer)."""
    if len(parts) == 1:
        return _hash(parts[0])
    h = _Hasher()
    for p in parts:
        h.update(p)
    return h.intdigest()


class Kind(enum.IntEnum):
    """What a journal record says about its task."""

    OK = 1
    ERROR = 2
    LOST = 3
    CANCELLED = 4


#: Record flag: the body holds this one task's value, not a list of a group's values.
FLAG_SINGLE = 1
#: Record flag (of a LOST record): the task's outcome was found damaged; it outranks the
#: outcome of the same attempt, whichever journal is read first.
FLAG_DAMAGED = 2
#: Record flag (of an error record): this run's error is run again (``retries=ew.Retry(on=...)``):
#: the record tells the attempt and its error, and is never the task's outcome.
FLAG_RERUN = 4

_REC = struct.Struct("<BBHIIIqqqqddqq")
RECORD_SIZE = _REC.size  # 80
_FRAME = struct.Struct("<IIQQ")
_FRAME_MAGIC = 0x45574A32
_FRAME1 = struct.Struct("<III")
_FRAME1_MAGIC = 0x45574A31
_MAGICS = (struct.pack("<I", _FRAME_MAGIC), struct.pack("<I", _FRAME1_MAGIC))


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


def make_record(kind: Kind, task: int, attempt: int = 0, *, flags: int = 0, **fields: float) -> Record:
    """A record with the given fields, the others zero."""
    return Record(int(kind), flags, attempt, task, **fields)


def pack_frame(records: list[Record]) -> bytes:
    """A journal frame holding ``records``."""
    body = b"".join([_REC.pack(*r) for r in records])
    head = struct.pack("<IIQ", _FRAME_MAGIC, len(records), _hash(body))
    return head + struct.pack("<Q", _hash(head)) + body


def scan_frames(data: bytes | bytearray | memoryview) -> tuple[list[Record], int, list[tuple[int, int, str]]]:
    """Read the frames of ``data`` (a journal from some offset on), skipping damage.

    Returns (the records of every whole frame whose checksums hold, where to go on reading,
    the damaged spans skipped: ``(start, end, what)``). Reading stops at a tail that may be a
    frame being written (see the module doc); damaged bytes are skipped to the next frame.
    """
    buf = data if isinstance(data, (bytes, bytearray)) else bytes(data)
    view = memoryview(buf)
    n = len(buf)
    out: list[Record] = []
    damaged: list[tuple[int, int, str]] = []
    make = Record._make
    pos = 0
    bad_from, why = -1, ""
    while pos < n:
        magic = int.from_bytes(buf[pos:pos + 4], "little") if pos + 4 <= n else -1
        if magic == _FRAME_MAGIC:
            if pos + _FRAME.size > n:
                break  # a tail
            _, count, body_hash, head_hash = _FRAME.unpack_from(buf, pos)
            end = pos + _FRAME.size + count * RECORD_SIZE
            if _hash(view[pos:pos + 16]) != head_hash:
                problem = "a frame header whose checksum does not hold"
            elif end > n:
                break  # a tail: the header holds, the rest is being written
            elif _hash(view[pos + _FRAME.size:end]) != body_hash:
                problem = "a frame whose checksum does not hold"
            else:
                problem = ""
                start = pos + _FRAME.size
        elif magic == _FRAME1_MAGIC:
            if pos + _FRAME1.size > n:
                break
            _, count, crc = _FRAME1.unpack_from(buf, pos)
            end = pos + _FRAME1.size + count * RECORD_SIZE
            if end > n:
                break  # (format 1 has no head check: a damaged count reads as a tail)
            start = pos + _FRAME1.size
            problem = "" if zlib.crc32(view[start:end]) == crc else "a frame whose checksum does not hold"
        elif magic < 0 and any(m.startswith(buf[pos:]) for m in _MAGICS):
            break  # the first bytes of a frame being written
        else:
            problem = "bytes that are not a frame"
        if not problem:
            if bad_from >= 0:
                damaged.append((bad_from, pos, why))
                bad_from = -1
            out.extend(map(make, _REC.iter_unpack(view[start:end])))
            pos = end
            continue
        if bad_from < 0:
            bad_from, why = pos, problem
        pos = _next_sync(buf, pos + 1)
    if bad_from >= 0:
        damaged.append((bad_from, pos, why))
    return out, pos, damaged


def _next_sync(buf: bytes | bytearray, start: int) -> int:
    """Where the next frame may begin at or after ``start``: the next magic number, or the
    first bytes of one at the very end, or the end."""
    found = [i for i in (buf.find(m, start) for m in _MAGICS) if i >= 0]
    if found:
        return min(found)
    n = len(buf)
    for p in range(max(start, n - 3), n):
        if any(m.startswith(buf[p:]) for m in _MAGICS):
            return p
    return n


def parse_frames(data: bytes | bytearray | memoryview) -> tuple[list[Record], int]:
    """The records of ``data``'s frames and where to go on reading (:func:`scan_frames`
    without the damage report)."""
    recs, used, _ = scan_frames(data)
    return recs, used


_RES_MAGIC = 0x45575232
_RES_MAGIC1 = 0x45575231
_RES_HEAD = struct.Struct("<IIQ")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def pack_body(pickled: bytes, buffers: list[memoryview]) -> list[bytes | memoryview]:
    """The parts of a result body, ready for ``os.writev``."""
    head = _RES_HEAD.pack(_RES_MAGIC, len(buffers), len(pickled))
    lens = struct.pack(f"<{len(buffers)}Q", *(b.nbytes for b in buffers))
    h = _Hasher(head)
    h.update(lens)
    h.update(pickled)
    for b in buffers:
        h.update(b)
    return [head, lens, _U64.pack(h.intdigest()), pickled, *buffers]


def body_size(parts: list[bytes | memoryview]) -> int:
    """Total length of the parts of a body."""
    return sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)


def unpack_body(data: bytes | bytearray | memoryview) -> tuple[memoryview, list[memoryview]]:
    """Split a result body into its pickle and its out-of-band buffers, checked.

    Raises ValueError saying what is wrong with a damaged body ("checksum mismatch", ...).
    """
    view = memoryview(data)
    n = len(view)
    if n < _RES_HEAD.size:
        raise ValueError(f"cut short ({n} bytes)")
    magic, nbuf, plen = _RES_HEAD.unpack_from(view, 0)
    if magic not in (_RES_MAGIC, _RES_MAGIC1):
        raise ValueError("not a result body (wrong magic number)")
    pos = _RES_HEAD.size
    check = _U64 if magic == _RES_MAGIC else _U32
    if pos + 8 * nbuf + check.size > n:
        raise ValueError("checksum mismatch (its header is damaged)")
    lens = struct.unpack_from(f"<{nbuf}Q", view, pos)
    pos += 8 * nbuf
    (want,) = check.unpack_from(view, pos)
    pos += check.size
    if pos + plen + sum(lens) != n:
        raise ValueError("checksum mismatch (its lengths do not add up)")
    pickled = view[pos:pos + plen]
    bufs = []
    at = pos + plen
    for k in lens:
        bufs.append(view[at:at + k])
        at += k
    if magic == _RES_MAGIC1:  # format 1: the pickle alone was checked
        if zlib.crc32(pickled) != want:
            raise ValueError("checksum mismatch")
        return pickled, bufs
    if checksum(view[:pos - check.size], view[pos:]) != want:
        raise ValueError("checksum mismatch")
    return pickled, bufs


_PAY_MAGIC = 0x45575032
_PAY_MAGIC1 = 0x45575031
_PAY_HEAD = struct.Struct("<IB3xQIIQ")
PAYLOAD_MAGICS = (struct.pack("<I", _PAY_MAGIC), struct.pack("<I", _PAY_MAGIC1))


class ChunkKind(enum.IntEnum):
    """What a payload chunk holds."""

    COMMON = 1  # the function, job data and run context shared by all tasks
    TASKS = 2  # the inputs of tasks first .. first+count-1


class ChunkHeader(namedtuple("ChunkHeader", "kind first count offset data_off data_len buf_lens check version")):
    """The header of one payload chunk, and where its parts lie in the file.

    kind (a :class:`ChunkKind`), first task, count, offset of the chunk, data_off and
    data_len of the compressed pickle, buf_lens, check (the data hash; format 1: the CRC32
    of the compressed pickle), version (1 or 2).
    """

    __slots__ = ()
    kind: ChunkKind
    first: int
    count: int
    offset: int
    data_off: int
    data_len: int
    buf_lens: tuple[int, ...]
    check: int
    version: int

    @property
    def end(self) -> int:
        """Offset just past this chunk."""
        return self.data_off + self.data_len + sum(self.buf_lens)

    def holds(self, data: bytes | memoryview, buffers: list[bytearray]) -> bool:
        """Whether the chunk's compressed pickle ``data`` and ``buffers`` match its checksum."""
        if self.version == 1:
            return zlib.crc32(data) == self.check
        return checksum(data, *buffers) == self.check


def pack_chunk_head(
    kind: ChunkKind, first: int, count: int, compressed: bytes, buffers: list[memoryview]
) -> bytes:
    """Header bytes (through the checksums) of a payload chunk."""
    head = _PAY_HEAD.pack(_PAY_MAGIC, int(kind), first, count, len(buffers), len(compressed))
    head += struct.pack(f"<{len(buffers)}Q", *(b.nbytes for b in buffers))
    return head + _U64.pack(_hash(head)) + _U64.pack(checksum(compressed, *buffers))


def read_chunk_header(read_at: object, offset: int) -> ChunkHeader | None:
    """Parse the chunk header at ``offset`` via ``read_at(offset, n) -> bytes``.

    Returns None at the end of the file or on a short (still being written) header; raises
    ValueError (what is wrong) on a damaged one.
    """
    reader = read_at  # a callable; typed loosely to keep this module import-light
    head = reader(offset, _PAY_HEAD.size)  # type: ignore[operator]
    if len(head) < _PAY_HEAD.size:
        if any(m.startswith(head[:4]) for m in PAYLOAD_MAGICS):
            return None
        raise ValueError("bytes that are not a chunk")
    magic, kind, first, count, nbuf, dlen = _PAY_HEAD.unpack(head)
    if magic not in (_PAY_MAGIC, _PAY_MAGIC1) or kind not in (1, 2):
        raise ValueError("bytes that are not a chunk")
    tail = 16 if magic == _PAY_MAGIC else 4
    if nbuf > 1 << 20:
        raise ValueError("a chunk header that is damaged")
    rest = reader(offset + _PAY_HEAD.size, 8 * nbuf + tail)  # type: ignore[operator]
    if len(rest) < 8 * nbuf + tail:
        return None
    lens = struct.unpack_from(f"<{nbuf}Q", rest, 0)
    if magic == _PAY_MAGIC:
        head_hash, check = struct.unpack_from("<QQ", rest, 8 * nbuf)
        if checksum(head, rest[:8 * nbuf]) != head_hash:
            raise ValueError("a chunk header whose checksum does not hold")
        version = 2
    else:
        (check,) = _U32.unpack_from(rest, 8 * nbuf)
        version = 1
    data_off = offset + _PAY_HEAD.size + 8 * nbuf + tail
    return ChunkHeader(ChunkKind(kind), first, count, offset, data_off, dlen, tuple(lens), check, version)


def seal_json(body: bytes) -> bytes:
    """A JSON object's bytes with its checksum added as the last key (see the module doc)."""
    if body[:1] != b"{" or body[-1:] != b"}":
        raise ValueError("only a JSON object is sealed")
    sep = b"" if body == b"{}" else b","
    return b'%s%s"_check":"%016x"}' % (body[:-1], sep, _hash(body))


_SEAL = len(b',"_check":"') + 16 + 2


def open_json(raw: bytes) -> bytes:
    """The JSON of a sealed object, checked (a file without a seal, written before there
    were seals, as it is). Raises ValueError saying what is wrong."""
    body = None
    if len(raw) >= _SEAL and raw[-2:] == b'"}':
        if raw[-_SEAL:-18] == b',"_check":"':
            body = raw[:-_SEAL] + b"}"
        elif raw[:-18] == b'{"_check":"':
            body = b"{}"
    if body is None:
        if b'"_check"' in raw or (raw[-2:] == b'"}' and _is_hex(raw[-18:-2])):
            raise ValueError("checksum mismatch (its checksum is damaged)")
        return raw
    if not _is_hex(raw[-18:-2]) or int(raw[-18:-2], 16) != _hash(body):
        raise ValueError("checksum mismatch")
    return body


def _is_hex(b: bytes) -> bool:
    return len(b) == 16 and all(c in b"0123456789abcdef" for c in b)


def iter_ranges(claim: list[int]) -> Iterator[int]:
    """Task indices of a claim stored as ``[start, stop]`` or ``[-1, i, j, ...]``."""
    if claim and claim[0] == -1:
        yield from claim[1:]
    elif len(claim) == 2:
        yield from range(claim[0], claim[1])


def claim_count(claim: list[int]) -> int:
    """How many tasks a claim stored as ``[start, stop]`` or ``[-1, i, j, ...]`` holds."""
    if claim and claim[0] == -1:
        return len(claim) - 1
    return claim[1] - claim[0] if len(claim) == 2 else 0


def claim_holds(claim: list[int], index: int) -> bool:
    """Whether a claim stored as ``[start, stop]`` or ``[-1, i, j, ...]`` holds task ``index``."""
    if claim and claim[0] == -1:
        return index in claim[1:]
    return len(claim) == 2 and claim[0] <= index < claim[1]
