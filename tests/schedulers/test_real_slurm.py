"""The SLURM syntax against the real SLURM of ci/services/slurm.sh (skipped without it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from scheduler_contract import (
    accounting,
    element_states,
    index_writer_context,
    submit,
    wait_for_job,
    wait_for_states,
    wait_until,
)

from elsewhere.schedulers import ScriptContext, SlurmSyntax
from elsewhere.util.states import TaskState as T


def _slurm_config() -> str | None:
    if not shutil.which("sbatch"):
        return None
    try:
        result = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


CONFIG = _slurm_config()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.skipif(CONFIG is None, reason="no running SLURM (ci/services/slurm.sh)"),
]


def _syntax() -> SlurmSyntax:
    text = CONFIG or ""
    if re.search(r"^AccountingStorageType\s*=\s*accounting_storage/slurmdbd", text, re.M):
        return SlurmSyntax(accounting="sacct")
    m = re.search(r"^JobCompLoc\s*=\s*(\S+)", text, re.M)
    if re.search(r"^JobCompType\s*=\s*jobcomp/filetxt", text, re.M) and m:
        return SlurmSyntax(accounting="jobcomp", jobcomp_file=m.group(1))
    return SlurmSyntax(accounting="none")


def _run(work: Path):
    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=work)

    return run


@pytest.fixture
def work(tmp_path):
    (tmp_path / "logs").mkdir()
    yield tmp_path
    # leave nothing queued behind: cancel what this test submitted
    subprocess.run(["scancel", "--name", "ewtest"], capture_output=True, timeout=30)


def test_array_states_logs_and_accounting(work):
    s = _syntax()
    run = _run(work)
    ctx = index_writer_context(s, work, fail=1, max_running=2)
    job = submit(s, ctx, work, run)
    idx = list(range(5))
    seen_running: set[int] = set()

    def settled(states):
        running = [i for i, st in states.items() if st is T.RUNNING]
        assert len(running) <= 2, states  # %2 holds
        seen_running.update(running)
        return all(st is not None and st.done for st in states.values())

    states = wait_for_states(s, job, idx, run, settled, timeout=120)
    assert states == {0: T.FINISHED, 1: T.FAILED, 2: T.FINISHED, 3: T.FINISHED, 4: T.FINISHED}
    for i in idx:
        assert (work / f"out.{i}").read_text() == f"{i}\n"
        log = Path(s.log_file(ctx.log_dir, ctx.job_name, job, i)).read_text()
        assert f"elsewhere: job {job} index {i} on" in log
    if s.accounting != "none":
        # slurmdbd learns of finished jobs a moment after squeue does
        history = wait_until(
            lambda: (
                (h := accounting(s, [job], run)) and element_states(s, job, idx, h) == states and h
            ),
            timeout=60,
        )
        assert history[s.element_id(job, 1)].exit_code == 3


def test_cancel_one_element_then_the_job(work):
    s = _syntax()
    run = _run(work)
    job = submit(s, index_writer_context(s, work, size=3, sleep=120), work, run)
    wait_for_states(
        s, job, [0, 1, 2], run, lambda st: all(v is T.RUNNING for v in st.values()), timeout=60
    )
    one = run(s.build_cancel([s.element_id(job, 1)]))
    assert s.cancel_ok(one.returncode, one.stderr, one.stdout)
    states = wait_for_states(s, job, [0, 1, 2], run, lambda st: st[1] is T.CANCELLED, timeout=30)
    assert states[0] is T.RUNNING
    rest = run(s.build_cancel([job]))
    assert s.cancel_ok(rest.returncode, rest.stderr, rest.stdout)
    wait_for_states(
        s, job, [0, 1, 2], run, lambda st: all(v is T.CANCELLED for v in st.values()), timeout=30
    )
    again = run(s.build_cancel([job]))
    assert s.cancel_ok(again.returncode, again.stderr, again.stdout)


def test_status_of_unknown_jobs_and_the_array_limit(work):
    s = _syntax()
    run = _run(work)
    gone = run(s.build_status(["999999"]))
    assert s.status_ok(gone.returncode, gone.stderr) and s.parse_status(gone.stdout) == {}
    limit = run(s.build_max_array_size())
    assert s.parse_max_array_size(limit.stdout) == int(
        re.search(r"MaxArraySize\s*=\s*(\d+)", CONFIG or "").group(1)
    )


def test_communicating_job_runs_ranks_with_srun(work):
    s = _syntax()
    run = _run(work)
    ctx = ScriptContext(
        job_name="ewtest",
        run_line="hostname",
        log_dir=str(work / "logs"),
        communicating=True,
        ranks=2,
    )
    job = submit(s, ctx, work, run)
    final = wait_for_job(
        s, job, run, lambda st: bool(st and st.state and st.state.done), timeout=120
    )
    assert final is not None and final.state is T.FINISHED and final.array_index is None
    log = Path(s.log_file(ctx.log_dir, ctx.job_name, job, None)).read_text().splitlines()
    assert len([ln for ln in log if not ln.startswith("elsewhere:")]) == 2  # one hostname per rank
