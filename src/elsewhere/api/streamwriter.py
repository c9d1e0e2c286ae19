"""The payload writer thread of an ``ew.Executor`` whose cluster takes its calls in memory
(the peers): the calls reach the job folder behind them (``streaming.py``).

A cluster that runs a controller in this process (the peers) takes the tasks in memory
instead, and hands each value back as it arrives; the job folder is still written, by two
threads off the path of a task: the payload by the writer thread here, the results (durable
before a worker forgets them) by the controller's recorder::

    submit() ──put──> controller ──TASK──> worker ──RESULT──> controller
        │                                                         ├── Future.set_result
        └──> payload writer thread: payload.log, queue.json       └── recorder: results, fsync, ACK

The collector thread still reads the journals, for what the controller does not hand back
(lost tasks, values it cannot unpickle, a restarted controller).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import queue
from typing import Any

log = logging.getLogger("elsewhere.api.executor")

_PAYLOAD_GATHER_S = 0.05
_PAYLOAD_DEFER_S = 1.0


def write_payload_behind(self: Any) -> None:
    """The writer thread: append the tasks to the payload (for a controller started
    later, ``retry`` and ``recover``), then count them in the queue.

    The controller sends each task from memory, so the payload is not on a task's
    path; written while the task is sent or runs, it would compete with it for the
    cores, the interpreter and the memory bus (100 MB of arguments cost more to
    write than to send). So tasks are taken together, and written once they ended
    or after ``_PAYLOAD_DEFER_S``, whichever comes first.
    """
    while True:
        items = [self.to_write.get()]
        if items[0] is not None:
            self.stop.wait(_PAYLOAD_GATHER_S)
            try:
                while items[-1] is not None:
                    items.append(self.to_write.get_nowait())
            except queue.Empty:
                pass
            # woken once, when the last of them ends, not by each result
            cf.wait([it[3] for it in items if it is not None], timeout=_PAYLOAD_DEFER_S)
        tasks = [it[:3] for it in items if it is not None]
        if tasks:
            try:
                _append(self, tasks)
            except BaseException:
                log.exception("cannot write the executor's tasks to job %r", self.job.name)
        if len(tasks) < len(items):
            return
        del items, tasks  # the calls' arguments are not kept until the next burst


def _append(self: Any, tasks: list[tuple[int, Any, Any]]) -> None:
    # Runs of consecutive tasks that send the same modules by value are written in one
    # call: a function shared by the run is then pickled once per chunk, not per task.
    start = 0
    while start < len(tasks):
        bv = tasks[start][2]
        end = start + 1
        while end < len(tasks) and tasks[end][2] is bv and tasks[end][0] == tasks[end - 1][0] + 1:
            end += 1
        lock = self.pickle_lock if bv.modules else contextlib.nullcontext()
        with lock, bv:
            self.writer.write_tasks(tasks[start][0], [t[1] for t in tasks[start:end]])
        start = end
    with self.job.store.locked_queue() as q:
        q.grow(tasks[-1][0] + 1)
    if self.link is not None and not self.link.alive():
        with contextlib.suppress(Exception):
            self.job.cluster.poll(self.job.handle)  # a new controller reads them from the payload
