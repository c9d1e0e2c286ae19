"""python= read as a command line (elsewhere.util.command), and written into every job script.

Fast: no scheduler, no worker. What runs for real is in test_local, test_ssh and test_batch.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import elsewhere as ew
from elsewhere.schedulers import ScriptContext, available, get_syntax
from elsewhere.util.command import PythonCommand
from elsewhere.util.errors import ConfigError

NASTY = ["a b", "it's", 'say "hi"', "$HOME", "`id`", "x;y", "&&", "tab\there", "", "*", "~/x"]


@pytest.mark.parametrize(
    ("given", "words", "setup"),
    [
        ("python3", ["python3"], []),
        ("  /opt/py 3/bin/python3  ", ["/opt/py", "3/bin/python3"], []),
        ("'/opt/py 3/bin/python3'", ["/opt/py 3/bin/python3"], []),
        ("apptainer exec --nv img.sif python3", ["apptainer", "exec", "--nv", "img.sif", "python3"], []),
        ("singularity exec 'my img.sif' python3", ["singularity", "exec", "my img.sif", "python3"], []),
        ("conda run --no-capture-output -n env python",
         ["conda", "run", "--no-capture-output", "-n", "env", "python"], []),
        ("module load python/3.11; python3", ["python3"], ["module load python/3.11"]),
        ("module load python/3.11 && python3", ["python3"], ["module load python/3.11 || exit $?"]),
        ("a; b && c ; python3 -X dev", ["python3", "-X", "dev"], ["a; b && c"]),
        ('eval "$(conda shell.bash hook)" && conda activate x && python',
         ["python"], ['eval "$(conda shell.bash hook)" && conda activate x || exit $?']),
        ("echo 'a; b' && python3", ["python3"], ["echo 'a; b' || exit $?"]),
        ("module load x 2>&1 && python3", ["python3"], ["module load x 2>&1 || exit $?"]),
        ("OMP_NUM_THREADS=1 python3", ["env", "OMP_NUM_THREADS=1", "python3"], []),
        (["podman", "run", "--rm", "-i", "img; x", "python3"],
         ["podman", "run", "--rm", "-i", "img; x", "python3"], []),
        (("python3", "-X", "dev"), ["python3", "-X", "dev"], []),
        (Path("/opt/py 3/python3"), ["/opt/py 3/python3"], []),
    ],
)  # fmt: skip
def test_the_forms_of_python(given, words, setup):
    cmd = PythonCommand.parse(given)
    assert list(cmd.words) == words
    assert list(cmd.setup) == setup
    assert cmd.plain == (len(words) == 1 and not setup)


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("apptainer exec 'img.sif python3", "No closing quotation"),
        ("module load x;", "ends without a command"),
        ("module load x &&", "ends without a command"),
        ("cat x | python3", "must follow ; or &&"),
        ("module load x || python3", "must follow ; or &&"),
        ("sleep 1 & python3", "must follow ; or &&"),
        ("module load x\npython3", "spans lines"),
        ([], "empty list"),
        (["", "python3"], "first word is empty"),
        (["python3", None], "str without NUL"),
        (b"python3", "takes a command line"),
        (3, "takes a command line"),
    ],
)
def test_a_bad_python_is_a_config_error_that_names_the_option(bad, said):
    with pytest.raises(ConfigError, match=r"^python") as err:
        PythonCommand.parse(bad)
    assert said in str(err.value)


@pytest.mark.parametrize("make", ["local", "ssh", "slurm", "sge", "lsf", "htcondor", "flux", "pbs"])
def test_every_backend_checks_python_when_it_is_made(make):
    from elsewhere.backends.ssh import SSHCluster

    for bad in ["", "'unclosed", []]:
        with pytest.raises(ConfigError, match="python"):
            if make == "local":
                ew.local(python=bad)
            elif make == "ssh":
                SSHCluster(["node1"], python=bad)
            else:
                ew.batch(make, python=bad, check=False)
    with pytest.raises(ConfigError, match=r"python\['node1'\]"):
        SSHCluster(["node1"], python={"node1": "'unclosed"})


def test_words_are_quoted_one_by_one_and_read_back_as_given():
    cmd = PythonCommand.parse(["wrap per", *NASTY, "python3"])
    assert shlex.split(cmd.shell("-m", "w", *NASTY)) == [*cmd.words, "-m", "w", *NASTY]
    # and a shell runs exactly those words
    line = PythonCommand.parse([sys.executable, "-c", "import sys; print(sys.argv[1:])"])
    out = subprocess.run(["sh", "-c", "exec " + line.shell(*NASTY)], capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    assert out.stdout.strip() == repr(NASTY)


def test_setup_runs_first_in_a_login_shell_and_and_stops_at_a_failure(tmp_path):
    marker = tmp_path / "ran"
    show = [sys.executable, "-c", "import os, sys; print(os.environ['EW_MARK'], sys.argv[1:])"]
    ok = PythonCommand.parse(f"export EW_MARK='x y' && {shlex.join(show)}")
    out = subprocess.run(ok.argv("a b", "it's"), capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "x y ['a b', \"it's\"]", out.stderr
    failed = PythonCommand.parse(f"false && touch {shlex.quote(str(marker))}")
    assert subprocess.run(failed.argv(), timeout=60).returncode == 1
    anyway = PythonCommand.parse(f"false; touch {shlex.quote(str(marker))}")
    assert subprocess.run(anyway.argv(), timeout=60).returncode == 0 and marker.exists()


def test_a_cluster_s_env_setup_comes_before_the_command_s_own():
    cmd = PythonCommand.parse("module load b && python3").with_setup(["module load a"])
    assert cmd.setup == ("module load a", "module load b || exit $?")
    assert cmd.text == "module load a; module load b && python3"


def _scripts():
    for name in available():
        for communicating in (False, True):
            if name == "htcondor" and communicating:
                continue  # the built-in template refuses it (the parallel universe)
            yield name, communicating


@pytest.mark.parametrize(("name", "communicating"), list(_scripts()))
def test_every_template_writes_the_setup_then_execs_the_words_as_given(name, communicating):
    cmd = PythonCommand.parse(
        "module load py/3 && source '/opt/my env/bin/activate' && "
        + shlex.join(["apptainer", "exec", "--bind", "/a b:/c", *NASTY, "python3"])
    ).with_setup(["export SITE=1"])
    job_dir = "/scratch/it's mine/job 1"
    syntax = get_syntax(name)
    ctx = ScriptContext(
        job_name="ew-test", run_line=cmd.shell("-m", "elsewhere.worker", "--job", job_dir),
        log_dir="/tmp/logs", array_size=1 if communicating else 3, env_setup=cmd.setup, env={"PYTHONUNBUFFERED": "1"},
        communicating=communicating, ranks=2 if communicating else 1,
    )  # fmt: skip
    text = syntax.render_script(ctx)
    check = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    lines = text.splitlines()
    runs = [i for i, line in enumerate(lines) if "elsewhere.worker" in line]
    assert len(runs) == 1, text
    words = shlex.split(lines[runs[0]])
    tail = [*cmd.words, "-m", "elsewhere.worker", "--job", job_dir]
    assert words[0] == "exec" and words[-len(tail) :] == tail, lines[runs[0]]
    setup = [lines.index(line) for line in cmd.setup]
    assert setup == sorted(setup) and setup[-1] < runs[0], text
