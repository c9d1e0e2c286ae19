"""The submit -> status -> cancel -> accounting path, run against any scheduler syntax.

Used by the fake-scheduler tests here and fit for real schedulers too: it
only uses the pure interface (render, build, parse) and runs the commands.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from elsewhere.schedulers import NativeStatus, SchedulerSyntax, ScriptContext
from elsewhere.util.states import TaskState

Run = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def index_writer_context(
    syntax: SchedulerSyntax, work: Path, *, size: int = 5, **kw: object
) -> ScriptContext:
    """An array whose element i writes i to ``work/out.i`` (and exits 3 when i == fail)."""
    var = syntax.array_index_var
    fail = kw.pop("fail", None)
    sleep = kw.pop("sleep", 0)
    body = f'echo ${var} > {work}/out.${var}; sleep {sleep}; echo "element ${var} done"'
    if fail is not None:
        body += f"; [ ${var} = {fail} ] && exit 3; exit 0"
    fields: dict[str, object] = dict(
        job_name="ewtest",
        run_line="sh -c " + shlex.quote(body),
        log_dir=str(work / "logs"),
        array_size=size,
        array_first=syntax.array_index_base,
    )
    fields.update(kw)
    return ScriptContext(**fields)  # type: ignore[arg-type]


def submit(
    syntax: SchedulerSyntax, ctx: ScriptContext, work: Path, run: Run, extra: Sequence[str] = ()
) -> str:
    """Render, write, submit; the job id."""
    script = work / f"{ctx.job_name}.sh"
    script.write_text(syntax.render_script(ctx))
    result = run(syntax.build_submit(str(script), list(extra)))
    assert result.returncode == 0, result.stderr
    return syntax.parse_submit(result.stdout)


def status(syntax: SchedulerSyntax, job_ids: Sequence[str], run: Run) -> dict[str, NativeStatus]:
    """One status call, checked with status_ok."""
    result = run(syntax.build_status(list(job_ids)))
    status_ok = getattr(syntax, "status_ok", lambda rc, err: rc == 0)
    assert status_ok(result.returncode, result.stderr), result.stderr
    return syntax.parse_status(result.stdout)


def accounting(
    syntax: SchedulerSyntax, job_ids: Sequence[str], run: Run
) -> dict[str, NativeStatus]:
    """One accounting call."""
    cmd = syntax.build_accounting(list(job_ids))
    assert cmd is not None
    result = run(cmd)
    ok = getattr(syntax, "accounting_ok", lambda rc, err: rc == 0)
    assert ok(result.returncode, result.stderr), result.stderr
    return syntax.parse_accounting(result.stdout)


def element_states(
    syntax: SchedulerSyntax, job_id: str, indices: Sequence[int], found: dict[str, NativeStatus]
) -> dict[int, TaskState | None]:
    """Element index -> state (None when the element is not in ``found``)."""
    out: dict[int, TaskState | None] = {}
    for i in indices:
        st = found.get(syntax.element_id(job_id, i))
        out[i] = st.state if st else None
    return out


def wait_until(
    predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.2
) -> object:
    """Poll ``predicate`` until it returns something true (that value); AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def wait_for_job(
    syntax: SchedulerSyntax,
    job_id: str,
    run: Run,
    done: Callable[[NativeStatus | None], bool],
    timeout: float = 30.0,
) -> NativeStatus | None:
    """Poll the status of a job that is no array until ``done(its status)``."""
    deadline = time.monotonic() + timeout
    while True:
        found = status(syntax, [job_id], run).get(job_id)
        if done(found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} never settled: {found}")
        time.sleep(0.2)


def wait_for_states(
    syntax: SchedulerSyntax,
    job_id: str,
    indices: Sequence[int],
    run: Run,
    done: Callable[[dict[int, TaskState | None]], bool],
    timeout: float = 30.0,
) -> dict[int, TaskState | None]:
    """Poll status until ``done(states)``."""
    deadline = time.monotonic() + timeout
    while True:
        states = element_states(syntax, job_id, indices, status(syntax, [job_id], run))
        if done(states):
            return states
        if time.monotonic() > deadline:
            raise AssertionError(f"states never settled: {states}")
        time.sleep(0.2)
