"""The SGE syntax against the real Grid Engine of ci/services/sge.sh (skipped without it)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from scheduler_contract import (
    accounting,
    element_states,
    index_writer_context,
    submit,
    wait_for_states,
    wait_until,
)

from elsewhere.schedulers import SGESyntax
from elsewhere.util.states import TaskState as T

SGE_ROOT = os.environ.get("SGE_ROOT", "/var/lib/gridengine")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("SGE_ROOT", SGE_ROOT)
    env.setdefault("SGE_CELL", "default")
    return env


def _sge_up() -> bool:
    qstat = shutil.which("qstat")
    if not qstat or "gridengine" not in os.path.realpath(qstat) or not os.path.isdir(SGE_ROOT):
        return False
    try:
        result = subprocess.run(
            ["qstat", "-xml"], capture_output=True, text=True, timeout=10, env=_env()
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and "<job_info" in result.stdout


pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not _sge_up(), reason="no running Grid Engine (ci/services/sge.sh)"),
]


def _run(work: Path):
    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=60, cwd=work, env=_env()
        )

    return run


@pytest.fixture
def work(tmp_path):
    (tmp_path / "logs").mkdir()
    yield tmp_path
    subprocess.run(["qdel", "ewtest"], capture_output=True, timeout=30, env=_env())


def test_array_states_logs_and_qacct(work):
    s = SGESyntax()
    run = _run(work)
    ctx = index_writer_context(s, work, fail=2, max_running=2)
    job = submit(s, ctx, work, run)
    idx = [1, 2, 3, 4, 5]

    def left_the_queue(states):
        assert list(states.values()).count(T.RUNNING) <= 2, states  # -tc 2
        return all(st is None for st in states.values())

    wait_for_states(s, job, idx, run, left_the_queue, timeout=120)  # qstat forgets finished tasks
    for i in idx:
        assert (work / f"out.{i}").read_text() == f"{i}\n"
        log = Path(s.log_file(ctx.log_dir, ctx.job_name, job, i)).read_text()
        assert f"elsewhere: job {job} index {i} on" in log
    expected = {1: T.FINISHED, 2: T.FAILED, 3: T.FINISHED, 4: T.FINISHED, 5: T.FINISHED}
    history = wait_until(
        lambda: (
            (h := accounting(s, [job], run)) and element_states(s, job, idx, h) == expected and h
        ),
        timeout=60,
    )
    assert history[s.element_id(job, 2)].exit_code == 3


def test_cancel_running_and_pending_tasks(work):
    s = SGESyntax()
    run = _run(work)
    job = submit(s, index_writer_context(s, work, size=4, max_running=2, sleep=120), work, run)
    idx = [1, 2, 3, 4]
    wait_for_states(
        s, job, idx, run, lambda st: list(st.values()).count(T.RUNNING) == 2, timeout=60
    )
    gone = run(s.build_cancel([s.element_id(job, 4), s.element_id(job, 1)]))
    assert s.cancel_ok(gone.returncode, gone.stderr, gone.stdout)
    states = wait_for_states(
        s, job, idx, run, lambda st: st[4] is None and st[1] in (None, T.CANCELLED), timeout=30
    )
    assert states[2] is T.RUNNING
    rest = run(s.build_cancel([job]))
    assert s.cancel_ok(rest.returncode, rest.stderr, rest.stdout)
    wait_for_states(
        s, job, idx, run, lambda st: all(v in (None, T.CANCELLED) for v in st.values()), timeout=30
    )
    again = run(s.build_cancel([job]))
    assert s.cancel_ok(
        again.returncode, again.stderr, again.stdout
    )  # "job N is already in deletion"


def test_array_limit_from_qconf(work):
    s = SGESyntax()
    result = _run(work)(s.build_max_array_size())
    assert result.returncode == 0 and s.parse_max_array_size(result.stdout) == 75000
