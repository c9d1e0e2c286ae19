"""The tree code: walking a folder, packing it as a tar stream, unpacking one safely.

:data:`TREE_SCRIPT` walks a folder with rsync-style include patterns, packs it as a tar
stream (zstd-compressed when ``zstandard`` is there), and unpacks one without writing
outside its root. It is plain Python 3.6+ with no imports beyond the standard library (and
``zstandard`` when present), because the same text runs in two places: here, loaded into a
namespace by :func:`tree_functions` (the local transport's copies), and on an ssh host
without rsync, where :mod:`elsewhere.hosts.sshcopy` ships it as ``python3 -c``.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Sequence
from typing import Any

__all__ = ["TREE_SCRIPT", "copy_path", "tree_functions"]

TREE_SCRIPT = r'''
import json, os, re, stat, sys, tarfile

MAGIC = b"EWTREE1 "
CHUNK = 1 << 20


def have_zstd():
    try:
        import zstandard  # noqa: F401
        return True
    except Exception:
        return False


def _glob_regex(pat):
    out, i = [], 0
    while i < len(pat):
        c = pat[i]
        if pat.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in pat[i + 2:]:
            j = pat.index("]", i + 2)
            body = pat[i + 1:j]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = j + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def compile_patterns(patterns):
    """rsync-style include patterns: without '/' they match the file name at any
    depth; with '/' or '**' the path under the root (anchored by a leading '/',
    else matched against its end). '*' stops at '/', '**' does not."""
    out = []
    for pat in patterns or ():
        anchored = pat.startswith("/")
        body = pat.lstrip("/")
        whole = anchored or "/" in body or "**" in body
        rx = _glob_regex(body)
        if whole and not anchored:
            rx = "(?:.*/)?" + rx
        out.append((re.compile(rx + r"\Z", re.S), whole))
    return out


def matches(rel, compiled):
    if not compiled:
        return True
    base = rel.rsplit("/", 1)[-1]
    for rx, whole in compiled:
        if rx.match(rel if whole else base):
            return True
    return False


def walk(root, compiled):
    """Yield (kind, rel, path, lstat) for 'dir', 'file' and 'link' entries under
    root, sorted, files filtered by the patterns; directories only without
    patterns (with patterns, parents are made as files need them)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/")
        names = sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        if not compiled:
            for d in dirnames:
                path = os.path.join(dirpath, d)
                if not os.path.islink(path):
                    yield "dir", rel_dir + "/" + d if rel_dir else d, path, os.lstat(path)
        for name in names:
            rel = rel_dir + "/" + name if rel_dir else name
            if not matches(rel, compiled):
                continue
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                yield "file", rel, path, st
            elif stat.S_ISLNK(st.st_mode):
                yield "link", rel, path, st


def signature(kind, path, st):
    """What 'unchanged' compares: size and whole-second mtime, or a link's target."""
    if kind == "link":
        return ["link", os.readlink(path)]
    return [st.st_size, int(st.st_mtime)]


def scan(root, compiled=None):
    """{rel: signature} of the files and links under root ({} if root is missing)."""
    if not os.path.isdir(root):
        return {}
    return {rel: signature(kind, path, st)
            for kind, rel, path, st in walk(root, compiled) if kind != "dir"}


def safe_rel(name):
    """A member name as a relative path that stays inside the root, or ValueError."""
    rel = name.replace("\\", "/").strip("/")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or name.startswith("/"):
        raise ValueError("unsafe path in archive: %r" % name)
    return "/".join(parts)


def inside(root, target):
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.dirname(target))
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def write_file(reader, target, mode, mtime):
    """Write reader's bytes to target atomically (temporary name, then rename)."""
    parent = os.path.dirname(target) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, ".%s.ewtmp-%d" % (os.path.basename(target), os.getpid()))
    try:
        with open(tmp, "wb") as f:
            while True:
                block = reader.read(CHUNK)
                if not block:
                    break
                f.write(block)
        os.chmod(tmp, mode & 0o7777)
        os.utime(tmp, (mtime, mtime))
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def make_link(rel, link_target, target):
    """Recreate a symlink, refusing targets that leave the copied tree."""
    if os.path.isabs(link_target) or os.path.normpath(
            os.path.join(os.path.dirname(rel), link_target)).startswith(".."):
        sys.stderr.write("skipped symlink %s -> %s: it points outside the folder\n"
                         % (rel, link_target))
        return False
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    if os.path.lexists(target) and not os.path.isdir(target):
        os.unlink(target)
    os.symlink(link_target, target)
    return True


def pack(root, opts, out):
    """Write header line + tar stream (zstd-compressed when asked) of root to out."""
    codec = opts.get("codec", "auto")
    if codec == "auto":
        codec = "zstd" if have_zstd() else "none"
    skip = opts.get("skip") or {}
    compiled = compile_patterns(opts.get("include"))
    if not os.path.lexists(root) or (opts.get("dir_only") and not os.path.isdir(root)):
        kind = "missing"
    elif os.path.isdir(root) and not os.path.islink(root):
        kind = "dir"
    else:
        kind = "file"
    header = {"codec": codec, "kind": kind, "name": os.path.basename(root.rstrip("/")),
              "path": root}
    out.write(MAGIC + json.dumps(header).encode() + b"\n")
    if kind == "missing":
        out.flush()
        return
    sink, finish = out, None
    if codec == "zstd":
        import zstandard
        cctx = zstandard.ZstdCompressor(level=int(opts.get("level", 3)),
                                        threads=int(opts.get("threads", 0)))
        sink = cctx.stream_writer(out)
        finish = lambda: sink.flush(zstandard.FLUSH_FRAME)  # noqa: E731
    tar = tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT)
    tar.copybufsize = CHUNK
    if kind == "file":
        tar.add(root, arcname="f", recursive=False)
    else:
        for kind_, rel, path, st in walk(root, compiled):
            if kind_ != "dir" and skip.get(rel) == signature(kind_, path, st):
                continue
            tar.add(path, arcname=rel, recursive=False)
    tar.close()
    if finish is not None:
        finish()
    out.flush()


def read_header(inp):
    """Skip anything a login script printed, return the header after MAGIC."""
    skipped = 0
    while True:
        line = inp.readline(1 << 16)
        if not line:
            raise EOFError("the stream ended before its header")
        pos = line.find(MAGIC)
        if pos >= 0:
            return json.loads(line[pos + len(MAGIC):].decode())
        skipped += len(line)
        if skipped > (1 << 20):
            raise ValueError("no header in the first MiB of the stream")


def unpack(root, inp):
    """Read header + tar stream from inp into root; return {"files", "bytes"}."""
    header = read_header(inp)
    if header["kind"] == "missing":
        raise FileNotFoundError("no such file or folder: %s" % header.get("path"))
    source = inp
    if header["codec"] == "zstd":
        import zstandard
        source = zstandard.ZstdDecompressor().stream_reader(inp)
    tar = tarfile.open(fileobj=source, mode="r|")
    files = nbytes = 0
    if header["kind"] == "dir":
        os.makedirs(root, exist_ok=True)
    for m in tar:
        if header["kind"] == "file":
            target = root
            if os.path.isdir(target):
                target = os.path.join(target, header["name"])
            rel = os.path.basename(target)
        else:
            rel = safe_rel(m.name)
            target = os.path.join(root, *rel.split("/"))
            if not inside(root, target):
                raise ValueError("refusing to write through a symlink: %s" % target)
        if m.isdir():
            os.makedirs(target, exist_ok=True)
        elif m.isfile():
            write_file(tar.extractfile(m), target, m.mode, m.mtime)
            files += 1
            nbytes += m.size
        elif m.issym():
            files += make_link(rel, m.linkname, target)
    return {"files": files, "bytes": nbytes}


def main(argv):
    mode, root = argv[1], argv[2]
    if mode == "pack":
        opts = json.loads(sys.stdin.buffer.readline() or b"{}")
        pack(root, opts, sys.stdout.buffer)
    elif mode == "unpack":
        try:
            summary = unpack(root, sys.stdin.buffer)
        except FileNotFoundError as exc:
            sys.stderr.write("%s\n" % exc)
            return 3
        sys.stdout.write(json.dumps(summary) + "\n")
    elif mode in ("scan", "caps"):
        answer = {"zstd": have_zstd(), "python": sys.version.split()[0],
                  "files": scan(root) if mode == "scan" else {}}
        sys.stdout.buffer.write(b"\n" + MAGIC + json.dumps(answer).encode() + b"\n")
    else:
        sys.stderr.write("unknown mode %r\n" % mode)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
'''


@functools.lru_cache(maxsize=1)
def tree_functions() -> dict[str, Any]:
    """The functions of :data:`TREE_SCRIPT`, loaded here (same text as on the far side)."""
    namespace: dict[str, Any] = {"__name__": "elsewhere_tree"}
    exec(compile(TREE_SCRIPT, "<elsewhere tree script>", "exec"), namespace)
    return namespace


def copy_path(
    src: str, dst: str, *, only_changed: bool, include: Sequence[str] | None = None
) -> None:
    """Copy a file or folder ``src`` to ``dst`` on this machine, each file atomically.

    A file copied onto an existing folder goes into it, as with ``cp``. With
    ``only_changed``, files whose size and mtime (whole seconds) match are skipped.
    """
    tree = tree_functions()
    st = os.lstat(src)  # FileNotFoundError names src
    if not stat.S_ISDIR(st.st_mode):
        if os.path.isdir(dst):
            dst = os.path.join(dst, os.path.basename(src.rstrip("/")))
        _copy_file(tree, src, dst, st)
        return
    compiled = tree["compile_patterns"](include)
    os.makedirs(dst, exist_ok=True)
    for kind, rel, path, entry in tree["walk"](src, compiled):
        target = os.path.join(dst, *rel.split("/"))
        if kind == "dir":
            os.makedirs(target, exist_ok=True)
        elif kind == "link":
            if only_changed and _same(tree, kind, path, entry, target):
                continue
            tree["make_link"](rel, os.readlink(path), target)
        elif not (only_changed and _same(tree, kind, path, entry, target)):
            _copy_file(tree, path, target, entry)


def _same(tree: dict[str, Any], kind: str, path: str, st: os.stat_result, target: str) -> bool:
    try:
        old = os.lstat(target)
    except OSError:
        return False
    old_kind = "link" if stat.S_ISLNK(old.st_mode) else "file"
    return bool(
        old_kind == kind
        and tree["signature"](kind, path, st) == tree["signature"](kind, target, old)
    )


def _copy_file(tree: dict[str, Any], src: str, dst: str, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        if os.path.lexists(dst):
            os.unlink(dst)
        os.symlink(os.readlink(src), dst)
        return
    with open(src, "rb") as reader:
        tree["write_file"](reader, dst, st.st_mode, st.st_mtime)
