"""What the page's buttons do: cancel a job or a task, retry, purge, through the control
functions (``core.control``) and nothing else, as ``elsewhere cancel`` and ``job.retry()`` do.

Each action opens the job afresh (``open_job``), as the command line does, so it shares no
reader with the board's watches; the board sees its effect at its next look. Whether the
request may act at all (the token, read-only) is ``access.py``'s to say, before this runs.
"""

from __future__ import annotations

from typing import Any

from ...core import control
from ...core.submit import open_job
from ...util.errors import ConfigError
from .board import JobBoard

VERBS = ("cancel", "retry", "purge", "cancel-task", "retry-task")


def act(board: JobBoard, job_id: str, verb: str, task: int | None = None) -> dict[str, Any]:
    """Do ``verb`` to job ``job_id`` (task ``task`` for the ``-task`` verbs); returns what the
    page says of it. Raises the control functions' errors (JobGone, NoSuchTask, StateError,
    ConfigError)."""
    if verb not in VERBS:
        raise ConfigError(f"unknown action {verb!r}: one of {', '.join(VERBS)}")
    if verb.endswith("-task") and task is None:
        raise ConfigError(f"{verb} needs a task index")
    w = board.watch(job_id, fresh=False)
    w.refreshed_at = 0.0  # the next look reads the folder again, whatever the action did
    cluster, handle = open_job(w.path)
    name = handle.name
    if verb == "cancel":
        control.cancel(cluster, handle)
        said = f"cancelled job {name!r}"
    elif verb == "cancel-task":
        assert task is not None
        done = control.cancel_task(cluster, handle, task)
        said = (
            f"cancelled task {task} of job {name!r}" if done else f"task {task} had ended already"
        )
    elif verb == "retry":
        again = control.retry(cluster, handle)
        said = (f"running {len(again)} task{'s' if len(again) != 1 else ''} of job {name!r} again" if again
                else f"job {name!r} has no failed or cancelled task to run again")  # fmt: skip
    elif verb == "retry-task":
        assert task is not None
        again = control.retry(cluster, handle, [task])
        said = (
            f"running task {task} of job {name!r} again"
            if again
            else f"task {task} is being retried already"
        )
    else:
        control.purge(cluster, handle)
        board.forget(w.id)
        said = f"purged job {name!r}"
    return {"ok": True, "message": said}
