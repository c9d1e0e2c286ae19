"""Jobs and the jobs table as HTML, for Jupyter (their ``_repr_html_``).

A :class:`~elsewhere.Job` (and the :class:`~elsewhere.Status` of ``job.check()``) shows its
state, a bar of its tasks by state and their counts; ``ew.jobs()`` returns a
:class:`JobTable`, a plain list of dicts that shows as a table. (A task's error,
:class:`~elsewhere.TaskError`, has its own ``_repr_html_`` in ``util/errors.py``: the lowest
layer cannot import this one.)

Every text shown is escaped (``html.escape``): a job's name, a backend's note, a cluster's
description are the user's text, never markup. Inline styles only, no style sheet and no
script, which Jupyter, JupyterLab, VS Code and nbviewer all keep as they are.
"""

from __future__ import annotations

import json
import time
from html import escape
from typing import Any

from ..util.states import JobState, TaskState

#: The colour of each task state on the bar and in the counts.
COLOURS = {
    TaskState.FINISHED: "#2e7d32",
    TaskState.FAILED: "#c62828",
    TaskState.CANCELLED: "#757575",
    TaskState.RUNNING: "#1565c0",
    TaskState.QUEUED: "#ef8f00",
    TaskState.PENDING: "#9e9e9e",
}
_JOB_COLOURS = {
    JobState.FINISHED: COLOURS[TaskState.FINISHED],
    JobState.FAILED: COLOURS[TaskState.FAILED],
    JobState.CANCELLED: COLOURS[TaskState.CANCELLED],
    JobState.RUNNING: COLOURS[TaskState.RUNNING],
    JobState.QUEUED: COLOURS[TaskState.QUEUED],
    JobState.PENDING: COLOURS[TaskState.PENDING],
}
_ORDER = (TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELLED, TaskState.RUNNING, TaskState.QUEUED,
          TaskState.PENDING)  # fmt: skip
_FONT = "font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;line-height:1.5"
_CELL = "padding:2px 10px;text-align:left;border-bottom:1px solid #ddd"


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else ""


def state_html(state: str) -> str:
    """A job's state, bold in its colour (a state this module does not know: uncoloured)."""
    try:
        colour = _JOB_COLOURS.get(JobState(state), "inherit")
    except ValueError:  # "missing", "unreadable: ..."
        colour = "inherit"
    return f'<b style="color:{colour}">{_e(state)}</b>'


def counts_html(counts: dict[TaskState, int]) -> str:
    """The states that have tasks, each in its colour: "8 finished · 1 failed · 3 running"."""
    parts = [
        f'<span style="color:{COLOURS[s]}">{counts[s]} {s.value}</span>'
        for s in _ORDER
        if counts.get(s)
    ]
    return " &middot; ".join(parts) or "no tasks"


def bar_html(counts: dict[TaskState, int], n: int, width: str = "24em") -> str:
    """A bar of ``n`` tasks, a segment per state (finished first), its width the share."""
    segments = []
    for s in _ORDER:
        k = counts.get(s, 0)
        if k and n:
            segments.append(f'<div title="{k} {s.value}" style="width:{100 * k / n:.3f}%;background:{COLOURS[s]}">'
                            "</div>")  # fmt: skip
    return (f'<div style="display:flex;width:{width};max-width:100%;height:8px;border-radius:4px;'
            f'overflow:hidden;background:#e0e0e0;margin:4px 0">{"".join(segments)}</div>')  # fmt: skip


def job_html(name: str, job_id: str, kind: str, state: JobState, counts: dict[TaskState, int], n: int,
             *, note: str = "", created: float | None = None) -> str:  # fmt: skip
    """A job: its name and state on a line, the bar, the counts, and the backend's note."""
    done = sum(
        counts.get(s, 0) for s in (TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELLED)
    )
    head = [f"<b>job</b> <code>{_e(name)}</code>", state_html(state.value),
            f"{done} of {n} task{'s' if n != 1 else ''} done"]  # fmt: skip
    if kind:
        head.append(f"on {_e(kind)}")
    tail = [x for x in (_e(job_id), _e(_when(created))) if x]
    lines = [
        " &nbsp; ".join(head)
        + (f' <span style="color:#757575">({", ".join(tail)})</span>' if tail else ""),
        bar_html(counts, n),
        counts_html(counts),
    ]
    if note:
        lines.append(f'<div style="color:#8a6d00">{_e(note)}</div>')
    return (
        f'<div class="elsewhere-job" style="{_FONT}">'
        + "".join(f"<div>{x}</div>" for x in lines)
        + "</div>"
    )


def _kind(cluster: Any) -> str:
    """A registry row's cluster (JSON text there) as the kind of its backend."""
    if isinstance(cluster, str):
        try:
            cluster = json.loads(cluster)
        except ValueError:
            return ""
    return str(cluster.get("kind", "")) if isinstance(cluster, dict) else ""


def _row_counts(row: dict[str, Any]) -> dict[TaskState, int]:
    out: dict[TaskState, int] = {}
    for state, k in (row.get("counts") or {}).items():
        try:
            out[TaskState(state)] = int(k)
        except (ValueError, TypeError):
            continue
    return out


class JobTable(list[dict[str, Any]]):
    """What ``ew.jobs()`` returns: a list of one dict per job, that shows as a table in
    Jupyter (name, state, tasks by state, where, when)."""

    def _repr_html_(self) -> str:
        if not self:
            return f'<div style="{_FONT}">no jobs (submit one with <code>ew.submit</code>)</div>'
        cols = ("name", "state", "tasks", "", "where", "created", "id")
        head = "".join(f'<th style="{_CELL}">{c}</th>' for c in cols)
        rows = []
        for row in self:
            counts = _row_counts(row)
            n = int(row.get("n_tasks") or 0)
            cells = (
                f"<code>{_e(row.get('name', ''))}</code>",
                state_html(str(row.get("state", ""))),
                f"{n}<br>{counts_html(counts) if counts else ''}",
                bar_html(counts, n, width="10em") if counts else "",
                _e(_kind(row.get("cluster"))),
                _e(_when(row.get("created"))),
                f'<span style="color:#757575">{_e(row.get("id", ""))}</span>',
            )
            rows.append("<tr>" + "".join(f'<td style="{_CELL}">{c}</td>' for c in cells) + "</tr>")
        return (f'<table class="elsewhere-jobs" style="border-collapse:collapse;{_FONT}"><thead><tr>{head}'
                f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")  # fmt: skip
