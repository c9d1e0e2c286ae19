"""python= as a command line in every built-in job-script template, run for real.

SLURM, Grid Engine and PBS (its template, through the slurm-torque wrappers over SLURM) are the
real services of ci/services; LSF, HTCondor and Flux are the stateful fakes of tests/fakes,
which run the submitted scripts. Each job runs its worker through the fake container runtime
after a setup (``export ... &&``): it must finish, every array element must have gone through
the wrapper with the image as given, and each task must see the setup's variable.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import elsewhere as ew

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from env_wrappers import inside, podman_command, python_prefixes

import services

pytestmark = pytest.mark.timeout(180)

FAKES = HERE.parent / "fakes"
SCHEDULERS = ["slurm", "sge", "slurm-torque", "lsf", "htcondor", "flux"]


@pytest.fixture(params=SCHEDULERS)
def scheduler(request, tmp_path, monkeypatch):
    """(kind, settings) of a batch cluster whose commands work here; skips when they do not."""
    name = request.param
    if name == "slurm":
        if services.slurm() is None:
            pytest.skip(services.why_no_slurm())
        return name, {"partition": "debug"}
    if name == "sge":
        if services.sge() is None:
            pytest.skip(services.why_no_sge())
        return name, {}
    if name == "slurm-torque":
        info = services.torque()
        if info is None:
            pytest.skip(services.why_no_torque())
        for key, value in info.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.chdir(tmp_path)
        return name, {}
    monkeypatch.setenv("ELSEWHERE_FAKE_STATE", str(tmp_path / "fake-state"))
    monkeypatch.setenv("ELSEWHERE_FAKE_KEEP_S", "2")
    monkeypatch.setenv("ELSEWHERE_FAKE_KILL_WAIT_S", "0.5")
    monkeypatch.setenv("PATH", f"{FAKES / name / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return name, {}


def test_every_element_runs_through_the_wrapper_after_the_setup(
    ew_home, scheduler, fake_container, odd_image
):
    kind, settings = scheduler
    python = f'export EW_SETUP_MARK="set up; it\'s" && {fake_container.command(odd_image)}'
    cl = ew.batch(kind, python=python, tasks_per_element=1, status_interval_s=0.5, **settings)
    job = ew.submit(inside, range(2), on=cl)
    job.wait(timeout=150)
    assert job.results() == [(x, odd_image, "set up; it's") for x in range(2)]
    runs = fake_container.runs()
    assert len({pid for pid, _, _ in runs}) == 2, runs  # one per array element
    for _pid, image, command in runs:
        assert image == odd_image
        assert command.startswith(f"{sys.executable} -m elsewhere.worker --job ")


def test_podman_runs_the_worker_of_a_slurm_job(ew_home, podman, tmp_path):
    """A real container in a real SLURM job: podman from Debian's packages."""
    if services.slurm() is None:
        pytest.skip(services.why_no_slurm())
    python = podman_command(podman, [*python_prefixes(), str(tmp_path)])
    cl = ew.slurm(partition="debug", python=python, status_interval_s=0.5)
    assert ew.map(_container_marker, [0], on=cl, timeout=150) == ["podman"]


def _container_marker(_):
    return os.environ.get("EW_CONTAINER")  # set by podman's -e, not in this process
