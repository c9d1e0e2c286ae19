"""The futures of an ``ew.Executor``: the standard library's own, whose ``cancel`` and
``running`` know where the call is (``streaming.py``)."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import time
from typing import Any

from ..util.errors import RemoteTraceback, TaskError

__all__ = ["StreamFuture", "raised"]


class StreamFuture(cf.Future[Any]):
    """A standard Future of a call on a stream; ``cancel`` and ``running`` follow the
    standard (a call a worker has taken cannot be cancelled; see ``Executor.kill``)."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self._ew_stream = stream
        self._ew_index = -1  # its task in the job, once sent (held back by max_workers: -1)

    def running(self) -> bool:
        if super().running():
            return True
        if self.done() or self._ew_index < 0:
            return False
        if self._ew_stream.taken(self._ew_index):
            self.set_running_or_notify_cancel()  # it stays running until it is done
            return True
        return False

    def cancel(self) -> bool:
        with self._condition:
            if self._state in ("RUNNING", "FINISHED"):
                return False
            if self._state in ("CANCELLED", "CANCELLED_AND_NOTIFIED"):
                return True
        if not self._ew_stream.withdraw(self):
            with contextlib.suppress(RuntimeError):
                self.set_running_or_notify_cancel()  # a worker has it: running from now on
            return False
        return super().cancel()

    def result(self, timeout: float | None = None) -> Any:
        try:
            return super().result(self._help(timeout))
        except cf.TimeoutError:
            raise cf.TimeoutError(self._late(timeout)) from None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            return super().exception(self._help(timeout))
        except cf.TimeoutError:
            raise cf.TimeoutError(self._late(timeout)) from None

    def _help(self, timeout: float | None) -> float | None:
        """Before waiting: let the cluster's controller in this process (the peers) read
        the result in this thread, if it can (``Controller.wait_for``); what is left of
        ``timeout`` after that."""
        wait_for = getattr(self._ew_stream.link, "wait_for", None)
        if wait_for is None or self._state == "FINISHED" or self._ew_index < 0:
            return timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        wait_for(self._ew_index, self.done, deadline)
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _late(self, timeout: float | None) -> str:
        """What a timeout says: where the call is, and what holds it back (the backend's note)."""
        job = self._ew_stream.job
        where = "running" if self.running() else "not started"
        note = ""
        try:
            note = job.check().note or ""
        except Exception:  # the message must not fail
            pass
        what = (
            f"task {self._ew_index}" if self._ew_index >= 0 else "a call held back by max_workers"
        )
        return f"{what} of job {job.name!r} did not finish within {timeout} s ({where}{'; ' + note if note else ''})"


def raised(err: TaskError) -> BaseException:
    """What a failed call raises: the task's own exception, its remote traceback as its
    cause, where it travelled; else the TaskError (its type's name and message)."""
    exc = err.exception
    if exc is None or err.reason != "error":
        return err
    if err.traceback:
        exc.__cause__ = RemoteTraceback(err.traceback)
    if hasattr(exc, "add_note"):
        with contextlib.suppress(Exception):
            exc.add_note(f"(raised by task {err.index} of job {err.job!r}"
                         f"{' on ' + err.host if err.host else ''})")  # fmt: skip
    return exc
