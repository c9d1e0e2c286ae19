"""Where an idle worker of the local pool waits, so that a job handed to several starts on all
of them at once.

A client hands a job to its idle workers one FIFO write after another (``backends/local.py``).
Left to itself, the kernel can wake the first on the client's own core, where it preempts the
client before the next write, and put the next one behind the first on the other core while a
core idles: measured on a two-core machine, in a third of the warm jobs of 10 000 no-ops one
worker ran them all, the other woken 2 ms late, once the first was done. So, while it waits
for a job, a pool worker

- is bound to one core of its own among those it may run on (it holds the lock of
  ``<pool>/cores/<core>``, a file per core, for as long as it lives: two workers of a pool never
  share one while there are cores enough; each pool looks from a core of its own, so that two
  pools' workers do not all wait on the first cores), so that two woken at once run side by side;
- runs under ``SCHED_BATCH``, the policy whose wake-ups do not preempt the task running, so
  that the client hands the job to all of them before any starts.

Once it has a job it takes back the cores and the policy it had, before anything of the job
runs: its tasks, and the processes they start, see neither. A worker started under another
policy than the default one (``chrt``) keeps it, and one bound to a single core by its user
stays so. Where a call fails (another OS; a cpuset changed meanwhile), the worker waits as it is.
"""

from __future__ import annotations

import fcntl
import os
import zlib

__all__ = ["IdleCore", "mark_idle"]

_CAN = hasattr(os, "sched_setaffinity") and hasattr(os, "SCHED_BATCH")


class IdleCore:
    """The core and the scheduling policy of one pool worker of ``pool`` while it is idle."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.core = -1  # the core it holds (-1: none, or not looked for yet)
        self._looked = False
        self._fd = -1  # the lock of that core's file
        self._cores: set[int] | None = None  # the cores it had, while bound to its own
        self._batch = False  # switched to SCHED_BATCH while idle

    def enter(self) -> None:
        """Before waiting for a job: bound to its core, under SCHED_BATCH."""
        if not _CAN:
            return
        try:
            cores = os.sched_getaffinity(0)
            if not self._looked:
                self._looked = True
                self._claim(sorted(cores))
            if self.core in cores and len(cores) > 1:
                os.sched_setaffinity(0, {self.core})
                self._cores = cores
            if os.sched_getscheduler(0) == os.SCHED_OTHER:
                os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
                self._batch = True
        except OSError:
            pass

    def leave(self) -> None:
        """A job came: the policy and the cores it had."""
        if self._batch:
            self._batch = False
            try:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            except OSError:
                pass
        cores, self._cores = self._cores, None
        if cores is not None:
            try:
                os.sched_setaffinity(0, cores)
            except OSError:  # (some of them left its cpuset meanwhile: those the kernel allows)
                try:
                    os.sched_setaffinity(0, range(os.cpu_count() or 1))
                except OSError:
                    pass

    def _claim(self, cores: list[int]) -> None:
        """Take the first core whose file no other live worker of the pool holds locked, looking
        from a place of the pool's own (pools of other interpreters or users start elsewhere)."""
        folder = os.path.join(self.pool, "cores")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        start = zlib.crc32(os.fsencode(self.pool)) % len(cores) if cores else 0
        for core in cores[start:] + cores[:start]:
            fd = os.open(os.path.join(folder, str(core)), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self._fd, self.core = fd, core  # (not inherited by what it execs: the lock goes with it)
            return


def mark_idle(pool: str, wid: str) -> str:
    """Say worker ``wid`` of pool folder ``pool`` is idle: its marker ``taken/<wid>`` (where
    the client that took it last put it) renamed back to ``idle/<wid>``; the first time, made
    there. Returns the marker's path. (A rename, not a file made and removed for every job:
    on disks where making a file costs 100 to 300 us, see ``kit.py``, the marker held up a
    worker's return, and its removal made every other new file slower.)"""
    marker = os.path.join(pool, "idle", wid)
    try:
        os.rename(os.path.join(pool, "taken", wid), marker)
    except OSError:  # (its first job; or a pool folder of before taken/)
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT, 0o600))
    return marker
