"""A progress bar for long waits, on terminals only (rich, imported when needed)."""

from __future__ import annotations

import sys
import time
from typing import Any

from .states import TaskState

#: Show the bar only once a wait has lasted this long.
SHOW_AFTER_S = 2.0


class Progress:
    """Shows done/total for a job once a wait lasts more than a couple of seconds."""

    def __init__(self, name: str, *, enabled: bool | None = None, stream: Any = None) -> None:
        self.name = name
        self.stream = stream or sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.t0 = time.monotonic()
        self._bar: Any = None
        self._task: Any = None

    def update(self, counts: dict[TaskState, int], total: int) -> None:
        """Show the counts (after :data:`SHOW_AFTER_S`)."""
        if not self.enabled or time.monotonic() - self.t0 < SHOW_AFTER_S:
            return
        done = sum(counts[s] for s in (TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELLED))
        failed = counts[TaskState.FAILED]
        running = counts[TaskState.RUNNING]
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[extra]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                console=Console(file=self.stream), transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.name, total=total, extra="")
        extra = f"{running} running" + (f", [red]{failed} failed" if failed else "")
        self._bar.update(self._task, completed=done, total=total, extra=extra)

    def close(self) -> None:
        """Stop showing the bar."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
