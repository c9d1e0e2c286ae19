"""``elsewhere status`` shows what the backend says of single tasks: here the real SLURM's
pending reason of a held array job, grouped by reason, and every task's in ``--json``."""

from __future__ import annotations

import time

import pytest

import services
from cli.conftest import strict_json

pytestmark = pytest.mark.timeout(120)


def test_status_shows_the_schedulers_reason_for_each_task(shell):
    if services.slurm() is None:
        pytest.skip(services.why_no_slurm())
    shell.python("""
        import elsewhere as ew
        held = ew.slurm(partition="debug", status_interval_s=0.5, sbatch=["--hold"])
        ew.submit(abs, [1, 2, 3], name="held", on=held)
    """)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        status = shell("status", "held")  # (SLURM may take a moment to give its reason)
        while "JobHeldUser" not in status.stdout and time.monotonic() < deadline:
            time.sleep(0.5)
            status = shell("status", "held")
        assert "  pending: JobHeldUser: tasks 0-2" in status.stdout.splitlines(), status.stdout
        reasons = strict_json(shell("status", "held", "--json").stdout)["reasons"]
        assert reasons == {str(i): "pending: JobHeldUser" for i in range(3)}
    finally:
        shell("cancel", "held")
