"""A pool worker's files for its next job, made while it waits for one.

A worker writes four files of its own in each job it joins: ``workers/<w>.cur`` (its lock
and the map of the task it runs), ``results/<w>.bin``, ``journal/<w>.rec`` and
``logs/<w>.log`` (its stdout and stderr). They are new files in every job: a process that
still holds one of a job's open (a task's child that outlived it, writing to its stdout)
cannot write into another job's.

Making a file is the slowest step of joining a job on some file systems: measured on a
virtual disk with ext4 without a journal, where the kernel looks past every inode of the group
freed in the last minute (six, while its block is not written back) for each new one, 100 us
to 1 ms each while jobs are purged around it, against 15 to 20 us for a rename. So, once idle, a pool worker makes the four files ahead,
in ``<pool>/kit/`` (:meth:`FileKit.fill`), keeps them open, and when it joins a job renames
each into place (:meth:`FileKit.take`): the files are as new as ever, and made while the
worker had nothing else to do. Where there is no kit file (a rename across file systems, a
worker that has not been idle yet) or the job's file exists already (the worker ran in the
job before: a retry), the worker opens the file in the job as it always did.

Kept free of heavy imports: the worker imports it at start-up.
"""

from __future__ import annotations

import errno
import os

__all__ = ["FileKit", "open_new", "remove_kit"]

#: the files of a kit, and how the worker opens each
FILES = {
    "cur": os.O_RDWR,
    "results": os.O_WRONLY | os.O_APPEND,
    "journal": os.O_WRONLY | os.O_APPEND,
    "log": os.O_WRONLY | os.O_APPEND,
}


class FileKit:
    """The files worker ``wid`` of pool folder ``pool`` has made for its next job."""

    def __init__(self, pool: str, wid: str) -> None:
        self.folder = os.path.join(pool, "kit")
        self.wid = wid
        self.ready: dict[str, tuple[str, int]] = {}  # name: (path in the kit, open descriptor)
        self.off = False  # no kits: the jobs are on another file system (or the worker leaves)

    def fill(self) -> None:
        """Make the files missing from the kit (none where kits are off)."""
        if self.off:
            return
        for name, flags in FILES.items():
            if name in self.ready:
                continue
            path = os.path.join(self.folder, f"{self.wid}.{name}")
            try:
                try:
                    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
                except FileNotFoundError:
                    os.makedirs(self.folder, mode=0o700, exist_ok=True)
                    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    os.unlink(path)  # (left by a fill that failed midway: not known to be new)
                    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
            except OSError:
                return  # (a full disk, a folder not writable): as without a kit, this time
            self.ready[name] = (path, fd)

    def take(self, name: str, target: str) -> int:
        """An open descriptor of the new file ``target`` (the kit's file ``name``, renamed
        there), or -1: no kit file, or ``target`` exists (the caller opens it as it is)."""
        entry = self.ready.pop(name, None)
        if entry is None:
            return -1
        path, fd = entry
        try:
            if os.path.lexists(target):  # only this worker makes files named for it
                self.ready[name] = entry
                return -1
            os.rename(path, target)
        except OSError as exc:
            if exc.errno == errno.EXDEV:  # the job is on another file system: no kits
                self.off = True
                _drop(path, fd)
            else:
                self.ready[name] = entry
            return -1
        return fd

    def discard(self) -> None:
        """Close and remove the files of the kit (the worker is leaving)."""
        self.off = True
        for path, fd in self.ready.values():
            _drop(path, fd)
        self.ready.clear()


def open_new(kit: FileKit | None, name: str, target: str) -> int:
    """A descriptor of the worker's file ``target`` of a job, as :data:`FILES` ``[name]``
    opens it: from ``kit`` where it has one, else opened (made if missing) in place."""
    fd = kit.take(name, target) if kit is not None else -1
    if fd < 0:
        fd = os.open(target, FILES[name] | os.O_CREAT, 0o600)
    return fd


def remove_kit(pool: str | os.PathLike[str], wid: str) -> None:
    """Remove the kit of worker ``wid`` of pool folder ``pool``, which ended without doing so
    (killed): a client that finds it gone calls this."""
    for name in FILES:
        try:
            os.unlink(os.path.join(pool, "kit", f"{wid}.{name}"))
        except OSError:
            pass


def _drop(path: str, fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
    try:
        os.unlink(path)
    except OSError:
        pass
