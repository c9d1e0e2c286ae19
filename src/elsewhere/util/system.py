"""What elsewhere needs of the operating system, checked where it is first needed.

elsewhere runs on Linux (README, "Platforms"). Two things it relies on are not everywhere:

- ``fcntl``'s file locks (POSIX): the job queue, the journals and the registry take them, so
  every job needs them. Windows has no ``fcntl``: the job folder's package checks once, as it
  is imported (:func:`require_fcntl`), and the shell says so in one line before anything else.
- ``/proc`` (Linux): a peer worker reads its tasks' memory and who connects over loopback
  there. It checks once, as it is made (:func:`require_proc`).

Both raise :class:`~elsewhere.util.errors.UnsupportedPlatform`, whose message names what is
missing, what needs it and what to do, instead of an ImportError of ``fcntl`` or a
FileNotFoundError of ``/proc/meminfo`` from deep inside.
"""

from __future__ import annotations

import errno
import os
import sys

# (util.errors, and the typing it imports, only where one is raised: the worker imports this
# module at its start, through the job folder's package, and pays for every import there)

__all__ = ["CoreWatch", "aes_in_hardware", "is_disk_full", "missing_fcntl", "no_space", "parse_aes_flag",
           "process_alive", "process_started", "require_fcntl", "require_proc"]

_SUPPORTED = "it runs on Linux (see the README's Platforms)"


def _system() -> str:
    return {"win32": "Windows", "darwin": "macOS"}.get(sys.platform, sys.platform)


def missing_fcntl() -> str | None:
    """Why this Python cannot run jobs, if it has no ``fcntl`` module; else None."""
    try:
        import fcntl  # noqa: F401  (the check itself: importing it is all)
    except ImportError:
        hint = "; on Windows, run it inside WSL" if sys.platform == "win32" else ""
        return (f"this Python on {_system()} has no fcntl module: elsewhere locks its job folders "
                f"with POSIX file locks, and {_SUPPORTED}{hint}")  # fmt: skip
    return None


def require_fcntl() -> None:
    """UnsupportedPlatform, saying what to do, if this Python has no ``fcntl`` module."""
    why = missing_fcntl()
    if why is not None:
        from .errors import UnsupportedPlatform

        raise UnsupportedPlatform(why)


def require_proc(what: str, proc: str = "/proc") -> None:
    """UnsupportedPlatform if there is no ``/proc`` here (``what`` needs it: "a peer worker")."""
    if not os.path.isfile(os.path.join(proc, "self", "stat")):
        from .errors import UnsupportedPlatform

        raise UnsupportedPlatform(
            f"{what} needs Linux's {proc} (its tasks' memory and the users of loopback connections "
            f"are read there), and there is none on this {_system()} system; run it on a Linux "
            "machine (controllers elsewhere reach it over the network)"
        )


def process_started(pid: int) -> float | None:
    """When process ``pid`` started (Unix time); None if there is none, or only its zombie.
    With the pid, it names a process: a pid reused later has another start time."""
    import contextlib

    import psutil

    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        if proc.status() != psutil.STATUS_ZOMBIE:
            return float(proc.create_time())
    return None


def parse_aes_flag(cpuinfo: str) -> bool:
    """Whether ``/proc/cpuinfo`` text says the CPU has AES instructions: the ``aes`` flag of
    x86 (``flags``) or the ``aes`` feature of ARM (``Features``)."""
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() in ("flags", "features") and "aes" in value.split():
            return True
    return False


_AES: list[bool] = []


def aes_in_hardware() -> bool:
    """Whether this machine's CPU has AES instructions (read once from ``/proc/cpuinfo``;
    where there is none to read, yes: every x86 CPU since about 2010 and every 64-bit ARM of
    a desktop or server has them). The peer network and ssh connections choose their
    cipher by it: AES-GCM where the CPU has AES, ChaCha20-Poly1305 where it has not."""
    if not _AES:
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                _AES.append(parse_aes_flag(f.read()))
        except OSError:
            _AES.append(True)
    return _AES[0]


class CoreWatch:
    """Whether a core is free now: fewer runnable threads on the machine than the cores this
    process may run on, by the running count of ``/proc/loadavg`` (read through one open
    descriptor: about 2 microseconds). A process that busy-polls asks it before it spins on,
    and sleeps instead when every core is wanted: spinning then only takes a core from work
    (on 2 cores, a map of tiny tasks on peers ran a third slower for its polling). Where
    there is no ``/proc/loadavg``, a core is always free (as before the watch)."""

    __slots__ = ("_cores", "_every", "_fd", "_next", "_wanted")

    def __init__(self, every_s: float = 1e-4, loadavg: str = "/proc/loadavg") -> None:
        self._every = every_s
        self._next = 0.0
        self._wanted = 0
        try:
            self._cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self._cores = os.cpu_count() or 1
        try:
            self._fd: int | None = os.open(loadavg, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    @property
    def cores(self) -> int:
        """The cores this process may run on."""
        return self._cores

    def free(self) -> bool:
        """True while the runnable threads (the caller among them) fit on the cores."""
        if self._fd is None:
            return True
        try:  # "0.75 2.13 2.81 3/345 12345": 3 runnable of 345
            running = os.pread(self._fd, 128, 0).split(b" ", 4)[3].partition(b"/")[0]
            return int(running) <= self._cores
        except (OSError, IndexError, ValueError):
            return True

    def may_spin(self, now: float) -> bool:
        """For a busy-poll loop, at each turn (``now``: ``time.monotonic()``): False once
        every core was wanted at two looks in a row (a look at most every ``every_s``: a
        thread that wakes for a moment, a result's reader, does not stop the polling)."""
        if now < self._next:
            return True
        self._next = now + self._every
        if self.free():
            self._wanted = 0
            return True
        self._wanted += 1
        if self._wanted < 2:
            return True
        self._wanted = 0
        return False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine is running (a zombie is not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: it exists
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc: kill(0) is all we know


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says a file system is full (or the user's quota used up)."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    # sqlite3 (the registry): SQLITE_FULL
    return getattr(exc, "sqlite_errorcode", None) == 13 or "database or disk is full" in str(exc)


def no_space(path: str | os.PathLike[str]) -> str:
    """The reason given for a full disk: "no space left on <path> (<n> bytes free)"."""
    try:
        st = os.statvfs(path)
        free = f"{st.f_bavail * st.f_frsize} bytes free"
    except OSError:
        free = "free space unknown"
    return f"no space left on {os.fspath(path)} ({free})"
