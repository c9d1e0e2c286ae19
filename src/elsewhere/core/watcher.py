"""``python -m elsewhere.core.watcher JOB_DIR``: the small detached process that watches a job
made with ``after=`` (``dependencies.py``) while there is something to watch.

It settles the job (``control.settle``: released once the jobs it waits for finished,
cancelled with the reason when one of them failed), looking every second at first, then less
often, up to every five seconds, and ends once nothing is left to watch: the job released
(and, if its backend then runs something in this process, a peer controller, run to its end),
cancelled or purged. Its output is the job's ``dependencies.log``.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..util.states import JobState
from . import control
from .dependencies import LOOK_S
from .opening import open_job
from .waiting import wait_for

if TYPE_CHECKING:
    from ..backends.base import Cluster
    from ..folder.handle import JobHandle

__all__ = ["main", "watch"]


def watch(path: Path, *, most_s: float = 5.0) -> int:
    """Watch the waiting job at ``path`` until there is nothing left to watch, looking every
    second at first, then less often, up to every ``most_s`` seconds. Returns an exit status."""
    try:
        cluster, handle = open_job(path)
    except Exception as exc:
        print(f"elsewhere: cannot watch job {path}: {exc}", file=sys.stderr, flush=True)
        return 1
    pause = LOOK_S
    while True:
        if not (path / "job.json").exists():
            return 0  # purged
        try:
            control.poll(cluster, handle)  # (settles it)
            left = control.settle(cluster, handle)
        except Exception as exc:
            print(f"elsewhere: watching job {handle.name!r}: {type(exc).__name__}: {exc}", file=sys.stderr,
                  flush=True)  # fmt: skip
            left = "held"
        if not left:
            if _runs_here(cluster, handle):
                wait_for(cluster, handle, JobState.FINISHED, timeout=None, progress=False, poll_interval_s=1.0)
            return 0
        time.sleep(pause)
        pause = min(most_s, pause * 1.5)


def _runs_here(cluster: Cluster, handle: JobHandle) -> bool:
    """Whether the backend runs the job in this process (a peer controller started here)."""
    controller = getattr(cluster, "controller", None)
    try:
        return callable(controller) and controller(handle) is not None
    except Exception:
        return False


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m elsewhere.core.watcher JOB_DIR``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m elsewhere.core.watcher JOB_DIR", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    return watch(Path(args[0]).absolute())


if __name__ == "__main__":
    sys.exit(main())
