"""The PBS syntax (variant slurm-torque) against Debian's PBS wrappers over the real SLURM.

ci/services/torque.sh unpacks the wrappers into /opt/elsewhere-ci/torque/bin; they need the
SLURM of ci/services/slurm.sh. Skipped without either.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from scheduler_contract import index_writer_context, status, submit, wait_until

from elsewhere.schedulers import PBSSyntax
from elsewhere.util.errors import SchedulerError
from elsewhere.util.states import TaskState as T

WRAPPERS = Path(os.environ.get("ELSEWHERE_CI_TORQUE_DIR", "/opt/elsewhere-ci/torque")) / "bin"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{WRAPPERS}{os.pathsep}{env.get('PATH', '')}"
    return env


def _up() -> bool:
    if not (WRAPPERS / "qsub").exists() or not shutil.which("scontrol"):
        return False
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return ping.returncode == 0 and "UP" in ping.stdout


pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        not _up(), reason="no PBS wrappers over a running SLURM (ci/services/torque.sh)"
    ),
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
    subprocess.run(["scancel", "--name", "ewtest"], capture_output=True, timeout=30)


def test_array_runs_with_pbs_directives_and_own_logs(work):
    s = PBSSyntax("slurm-torque")
    run = _run(work)
    ctx = index_writer_context(s, work, size=3, max_running=2, walltime_s=600)
    job = submit(s, ctx, work, run)
    assert job.isdigit()
    wait_until(lambda: all((work / f"out.{i}").exists() for i in range(3)), timeout=120)
    for i in range(3):
        assert (
            work / f"out.{i}"
        ).read_text() == f"{i}\n"  # PBS_ARRAYID came from SLURM_ARRAY_TASK_ID
        log = Path(s.log_file(ctx.log_dir, ctx.job_name, job, i))
        wait_until(lambda log=log: log.exists() and "done" in log.read_text(), timeout=60)
        assert f"elsewhere: job {job} index {i} on" in log.read_text()
    found = wait_until(lambda: (st := status(s, [job], run)) and job in st and st, timeout=30)
    assert found[job].state in (
        T.RUNNING,
        T.FINISHED,
    )  # job level only: elements carry raw SLURM ids
    limit = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job, "-o", "%l"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "10:00" in limit.stdout  # #PBS -l walltime reached sbatch


def test_cancel_is_per_job(work):
    s = PBSSyntax("slurm-torque")
    run = _run(work)
    job = submit(s, index_writer_context(s, work, size=2, sleep=120), work, run)
    wait_until(lambda: (work / "out.0").exists(), timeout=60)
    with pytest.raises(SchedulerError, match="whole array"):
        s.build_cancel([s.element_id(job, 1)])
    result = run(s.build_cancel([job]))
    assert s.cancel_ok(result.returncode, result.stderr, result.stdout)

    def slurm_states() -> set[str]:
        out = subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], capture_output=True, text=True
        )
        return set(out.stdout.split())

    wait_until(
        lambda: slurm_states() == {"CANCELLED"}, timeout=60
    )  # both elements, through SLURM's eyes
    again = run(s.build_cancel([job]))
    assert s.cancel_ok(again.returncode, again.stderr, again.stdout)
