"""The `elsewhere` command line, run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import elsewhere as ew

pytestmark = pytest.mark.timeout(120)


def run(*args, check=True):
    out = subprocess.run([sys.executable, "-m", "elsewhere", *args], capture_output=True, text=True,
                         timeout=90, env=dict(os.environ))
    if check:
        assert out.returncode == 0, out.stderr
    return out


def _talk(x):
    print(f"hello {x}")
    return {"x": x}


def test_cli_verbs(ew_home):
    ew.submit(_talk, [1, 2], name="clijob").wait(timeout=60)
    assert "clijob" in run("jobs").stdout
    assert json.loads(run("jobs", "--json").stdout)[0]["name"] == "clijob"
    assert "finished 2" in run("status", "clijob").stdout
    assert json.loads(run("status", "clijob", "--json").stdout)["state"] == "finished"
    assert run("wait", "clijob").returncode == 0
    res = json.loads(run("results", "clijob", "--json").stdout)
    assert res == [{"task": 0, "value": {"x": 1}}, {"task": 1, "value": {"x": 2}}]
    assert "hello 2" in run("logs", "clijob", "1").stdout
    assert run("purge", "clijob").returncode == 0
    bad = run("status", "clijob", check=False)
    assert bad.returncode == 2 and "no job named 'clijob'" in bad.stderr


def _arrays(n):
    import numpy as np

    return {"a": np.arange(n), "x": np.float64(n) / 2, "c": complex(n, 1), "s": {n}}


def test_results_as_json_keep_arrays_as_numbers(ew_home):
    pytest.importorskip("numpy")
    ew.submit(_arrays, [2], name="arrays").wait(timeout=60)
    (res,) = json.loads(run("results", "arrays", "--json").stdout)
    assert res["value"] == {"a": [0, 1], "x": 1.0, "c": "(2+1j)", "s": [2]}


def test_cli_cancel(ew_home):
    import time

    ew.submit(time.sleep, [30, 30], name="tocancel")
    out = run("cancel", "tocancel").stdout
    assert "cancelled" in out


def test_demo_runs(ew_home):
    out = run("demo", "--tasks", "4", "--samples", "20000").stdout
    assert "pi estimate" in out and "speed-up" in out


FIT_MODULE = """
from dataclasses import dataclass

@dataclass
class Fit:
    x: int
    chi2: float

def fit(x):
    return Fit(x, x * 0.5)
"""


def test_results_of_the_users_own_classes_are_read_from_any_folder(ew_home, tmp_path):
    project, other = tmp_path / "project", tmp_path / "other"
    project.mkdir()
    other.mkdir()
    (project / "labfits.py").write_text(FIT_MODULE)
    submit = ("import elsewhere as ew, labfits\n"
              "ew.submit(labfits.fit, range(3), name='fits', on=ew.local(cores=2)).wait(timeout=60)\n")
    subprocess.run([sys.executable, "-c", submit], cwd=project, check=True, timeout=90, env=dict(os.environ))
    # the results are pickles of labfits.Fit: read where labfits is not on sys.path
    shown = subprocess.run([sys.executable, "-m", "elsewhere", "results", "fits"], cwd=other, capture_output=True,
                           text=True, timeout=90, env=dict(os.environ))
    assert shown.returncode == 0, shown.stderr
    assert "Fit(x=2, chi2=1.0)" in shown.stdout
    read = "import elsewhere as ew\nprint([f.chi2 for f in ew.recover('fits').results()])\n"
    got = subprocess.run([sys.executable, "-c", read], cwd=other, capture_output=True, text=True, timeout=90,
                         env=dict(os.environ))
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "[0.0, 0.5, 1.0]"
