"""A progress bar for long waits, on terminals (rich, imported when needed) and, when asked
for (``progress=True``), in Jupyter, and what holds a job back (the backend's note: no peer
seen, a scheduler's pending reason), on the bar or, without one (a log), as a logged warning.

In Jupyter, rich's live display needs ipywidgets; the bar is shown there instead as a rich
renderable through IPython's ``display`` and updated in place (``display_id``), which every
Jupyter front end does without extra packages."""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any

from .states import TaskState

log = logging.getLogger("elsewhere")

#: Show the bar only once a wait has lasted this long.
SHOW_AFTER_S = 2.0
#: Off a terminal, warn of a note once it has stood this long (the same note once per wait).
NOTE_AFTER_S = 10.0
#: In Jupyter, redraw the bar at most this often (each redraw is a message to the front end).
NOTEBOOK_REDRAW_S = 0.5


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
        self._shown: Any = None  # in Jupyter: the display handle the bar is redrawn through
        self._drawn_at = 0.0
        self._teller = NoteTeller(name)

    def update(self, counts: dict[TaskState, int], total: int, note: str = "") -> None:
        """Show the counts (after :data:`SHOW_AFTER_S`), and ``note``: what the backend
        says holds the job back, if anything."""
        if not self.enabled:
            self._teller.see(note)
            return
        if time.monotonic() - self.t0 < SHOW_AFTER_S:
            return
        done = sum(counts[s] for s in (TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELLED))
        failed = counts[TaskState.FAILED]
        running = counts[TaskState.RUNNING]
        if self._bar is None:
            from rich.console import Console
            from rich.markup import escape
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar
            from rich.text import Text

            class WithNote(Bar):
                note = ""

                def get_renderables(self) -> Any:
                    yield self.make_tasks_table(self.tasks)
                    if self.note:  # on a line of its own: the bar keeps its width
                        yield Text(self.note, style="yellow", no_wrap=True, overflow="ellipsis")

            console = Console(file=self.stream)
            jupyter = console.is_jupyter  # no live display there: it needs ipywidgets
            self._bar = WithNote(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[extra]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                console=console, transient=False, auto_refresh=not jupyter,
            )
            if jupyter:
                from IPython.display import display

                self._shown = display(self._bar, display_id=True)
            else:
                self._bar.start()
            # the name is text, not markup: "fit[/x]" shows as it is
            self._task = self._bar.add_task(escape(self.name), total=total, extra="")
        extra = f"{running} running" + (f", [red]{failed} failed[/red]" if failed else "")
        self._bar.note = f"  {note}" if note else ""
        self._bar.update(self._task, completed=done, total=total, extra=extra)
        if self._shown is not None and time.monotonic() - self._drawn_at >= NOTEBOOK_REDRAW_S:
            self._redraw()

    def _redraw(self) -> None:
        self._drawn_at = time.monotonic()
        self._shown.update(self._bar)

    def close(self) -> None:
        """Stop showing the bar."""
        if self._shown is not None:
            self._redraw()  # the last counts stay in the notebook
            self._shown = None
        elif self._bar is not None:
            self._bar.stop()
        self._bar = None


class NoteTeller:
    """Logs what holds job ``name`` back once the same note has stood :data:`NOTE_AFTER_S`,
    each note once: where no bar shows it (off a terminal; an Executor's futures)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._gist, self._since = "", 0.0
        self._told: set[str] = set()

    def see(self, note: str) -> None:
        now = time.monotonic()
        gist = re.sub(r"\d+", "#", note)  # "3 pending: Resources" stands while counts change
        if gist != self._gist:
            self._gist, self._since = gist, now
        if note and gist not in self._told and now - self._since >= NOTE_AFTER_S:
            self._told.add(gist)
            log.warning("job %s: %s", self.name, note)
