"""What the checksums of the job folder cost: the hash itself, and writing and reading results.

    .venv/bin/python bench/checksum.py [--mb 100] [--rounds 7] [--json FILE]

1. Throughput (MB/s, best of ``--rounds``) over ``--mb`` MB of random bytes of the checksum
   the job folder uses (XXH3-64, from ``xxhash``) and of the alternatives: zlib's CRC32 and
   Adler-32 (standard library), XXH64 and XXH32, and CRC32C where ``google-crc32c`` is
   installed (it is not a dependency: ``pip install google-crc32c`` to see it).
2. The overhead on results: ``--mb`` MB of results (ten NumPy arrays, out-of-band buffers, in
   one result body) written to a results file (page cache, no fsync: the worst case for the
   ratio; a worker also fsyncs) and read back (read, checked, unpickled), with the checksum
   against the same bytes without it; and what CRC32 in its place would cost. Each a median of
   ``--rounds``. "ratio" is checked time over unchecked time (1.00: free).
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np
import xxhash

from elsewhere.folder import records, serial
from elsewhere.folder.store import writev_all


def best(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def throughput(mb: int, rounds: int) -> list[tuple[str, float]]:
    data = os.urandom(mb << 20)
    view = memoryview(data)
    hashes: list[tuple[str, Callable[[], object]]] = [
        ("xxh3_64 (xxhash; used)", lambda: xxhash.xxh3_64_intdigest(view)),
        ("xxh64 (xxhash)", lambda: xxhash.xxh64_intdigest(view)),
        ("xxh32 (xxhash)", lambda: xxhash.xxh32_intdigest(view)),
        ("crc32 (zlib, stdlib)", lambda: zlib.crc32(view)),
        ("adler32 (zlib, stdlib)", lambda: zlib.adler32(view)),
    ]
    try:
        import google_crc32c

        hashes.append((f"crc32c (google-crc32c, {google_crc32c.implementation})",
                       lambda: google_crc32c.value(data)))  # fmt: skip
    except ImportError:
        pass
    return [(name, mb / best(fn, rounds)) for name, fn in hashes]


def _unchecked_parts(pickled: bytes, bufs: list[memoryview]) -> list[bytes | memoryview]:
    """A result body of the same layout with no checksum computed (the baseline)."""
    head = struct.pack("<IIQ", 0x45575232, len(bufs), len(pickled))
    lens = struct.pack(f"<{len(bufs)}Q", *(b.nbytes for b in bufs))
    return [head, lens, b"\0" * 8, pickled, *bufs]


def _unchecked_split(buf: bytearray) -> tuple[memoryview, list[memoryview]]:
    view = memoryview(buf)
    _, nbuf, plen = struct.unpack_from("<IIQ", view, 0)
    lens = struct.unpack_from(f"<{nbuf}Q", view, 16)
    pos = 16 + 8 * nbuf + 8
    pickled = view[pos : pos + plen]
    pos += plen
    out = []
    for n in lens:
        out.append(view[pos : pos + n])
        pos += n
    return pickled, out


def results(mb: int, rounds: int, folder: str) -> dict[str, list[float]]:
    arrays = [np.random.default_rng(k).random((mb << 20) // 80) for k in range(10)]
    pickled, bufs = serial.dumps_plain(arrays)
    path = os.path.join(folder, "w.bin")
    times: dict[str, list[float]] = {k: [] for k in ("write", "write0", "read", "read0", "crc32")}
    for r in range(rounds):
        writes = (
            ("write0", _unchecked_parts),
            ("write", records.pack_body),
        )  # checked last: read next
        reads = (("read", records.unpack_body), ("read0", _unchecked_split))
        for key, make in writes:
            if os.path.exists(path):
                os.remove(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            t = time.perf_counter()
            parts = make(pickled, bufs)
            writev_all(fd, parts)
            times[key].append(time.perf_counter() - t)
            os.close(fd)
        size = os.path.getsize(path)
        for key, split in (
            reads if r % 2 else reads[::-1]
        ):  # in turn first: a busy machine's noise on both
            fd = os.open(path, os.O_RDONLY)
            t = time.perf_counter()
            buf = bytearray(size)
            os.preadv(fd, [buf], 0)
            p, b = split(buf)
            values = serial.loads(p, b)
            times[key].append(time.perf_counter() - t)
            os.close(fd)
            assert len(values) == 10
        t = time.perf_counter()
        crc = zlib.crc32(pickled)
        for x in bufs:
            crc = zlib.crc32(x, crc)
        times["crc32"].append(time.perf_counter() - t)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from report import Figures

    record = Figures("checksum", sys.argv[1:])
    print(f"checksum throughput over {args.mb} MB (best of {args.rounds}), load {os.getloadavg()[0]:.2f}:")
    rates = throughput(args.mb, args.rounds)
    for name, rate in rates:
        print(f"  {name:42s} {rate:8.0f} MB/s")
    with tempfile.TemporaryDirectory() as folder:
        t = {k: statistics.median(v) for k, v in results(args.mb, args.rounds, folder).items()}
    print(
        f"\n{args.mb} MB of results (10 arrays, out of band), median of {args.rounds}, page cache:"
    )
    print(f"  {'':8s} {'checked':>9s} {'unchecked':>10s} {'ratio':>6s}   ratio with crc32 instead")
    for what, a, b in (("write", t["write"], t["write0"]), ("read", t["read"], t["read0"]),
                       ("both", t["write"] + t["read"], t["write0"] + t["read0"])):  # fmt: skip
        crc = t["crc32"] * (2 if what == "both" else 1)
        print(
            f"  {what:8s} {a * 1e3:7.1f} ms {b * 1e3:8.1f} ms {a / b:6.2f}   {(b + crc) / b:6.2f}"
        )
    if args.json:
        record.compare("hash", f"Checksum throughput over {args.mb} MB, one core", rates[0], rates[1:], "MB/s",
                       better="higher")  # fmt: skip
        for what, key in (("written to a results file (page cache)", "write"), ("read back and checked", "read")):
            record.compare("results", f"{args.mb} MB of results (10 arrays) {what}", ("with XXH3-64", t[key]),
                           [("without a checksum", t[f"{key}0"]), ("with CRC32 instead", t[f"{key}0"] + t["crc32"])],
                           "s")  # fmt: skip
        record.write(args.json)


if __name__ == "__main__":
    main()
