"""Bad inputs to every public function, as a careless user gives them: negative counts, text
where numbers go, unknown option names, a non-callable, a missing job name, a task index the
job does not have. Each must raise one of elsewhere's errors (ConfigError, or the subclass that
says more: NoSuchTask, ProfileNotFound, JobNotFound, StateError) with a message, never a raw
TypeError, ValueError or IndexError from inside.

``KNOWN_GAPS`` lists the cases that still give a raw error, each with the fix it needs (none
now): they are tried and tallied, but not failed on; one that is fixed must leave the list."""

from __future__ import annotations

import pytest

import elsewhere as ew
from elsewhere.util.errors import ConfigError, JobError, JobNotFound, NoSuchTask, StateError

pytestmark = pytest.mark.timeout(120)


def _cases(job: ew.Job) -> dict[str, tuple[object, type[BaseException]]]:
    """``{what: (call, the error it must raise)}``."""
    fresh = ew.create_job  # an unsubmitted job, for add_task
    return {
        # clusters
        "local(cores=-1)": (lambda: ew.local(cores=-1), ConfigError),
        "local(cores='x')": (lambda: ew.local(cores="x"), ConfigError),
        "local(cores=0)": (lambda: ew.local(cores=0), ConfigError),
        "local(cores=2.5)": (lambda: ew.local(cores=2.5), ConfigError),
        "local(cores_per_task=0)": (lambda: ew.local(cores_per_task=0), ConfigError),
        "local(cores_per_task='a')": (lambda: ew.local(cores_per_task="a"), ConfigError),
        "local(idle_timeout_s=-1)": (lambda: ew.local(idle_timeout_s=-1), ConfigError),
        "local(idle_timeout_s='x')": (lambda: ew.local(idle_timeout_s="x"), ConfigError),
        "local(memory='2G')": (lambda: ew.local(memory="2G"), ConfigError),
        "slurm(memory=1)": (lambda: ew.slurm(memory=1), ConfigError),
        "slurm(walltime=-1)": (lambda: ew.slurm(walltime=-1), ConfigError),
        "slurm(cores_per_task='x')": (lambda: ew.slurm(cores_per_task="x"), ConfigError),
        "ssh(5)": (lambda: ew.ssh(5), ConfigError),
        "ssh([])": (lambda: ew.ssh([]), ConfigError),
        "ssh({'h': -1})": (lambda: ew.ssh({"h": -1}), ConfigError),
        "ssh(['h'], bogus=1)": (lambda: ew.ssh(["h"], bogus=1), ConfigError),
        "ssh({'h'})": (lambda: ew.ssh({"h"}), ConfigError),
        "peers(memory='x')": (lambda: ew.peers(memory="x"), ConfigError),
        "peers(5)": (lambda: ew.peers(5), ConfigError),
        "peers(bogus=1)": (lambda: ew.peers(bogus=1), ConfigError),
        "batch('nosuch')": (lambda: ew.batch("nosuch"), ConfigError),
        "batch(5)": (lambda: ew.batch(5), ConfigError),
        "cluster('nosuch')": (lambda: ew.cluster("nosuch"), ConfigError),
        # map, submit, create_job
        "map(5, [1])": (lambda: ew.map(5, [1]), ConfigError),
        "map(abs, 5)": (lambda: ew.map(abs, 5), ConfigError),
        "map(abs, 'text')": (lambda: ew.map(abs, "text"), ConfigError),
        "map(abs, [1], [1, 2])": (lambda: ew.map(abs, [1], [1, 2]), ConfigError),
        "map(errors='x')": (lambda: ew.map(abs, [1], errors="x"), ConfigError),
        "map(bogus=1)": (lambda: ew.map(abs, [1], bogus=1), ConfigError),
        "map(on=5)": (lambda: ew.map(abs, [1], on=5), ConfigError),
        "map(timeout='x')": (lambda: ew.map(abs, [1], timeout="x"), ConfigError),
        "map(timeout=-1)": (lambda: ew.map(abs, [1], timeout=-1), ConfigError),
        "submit(retries=-1)": (lambda: ew.submit(abs, [1], retries=-1), ConfigError),
        "submit(retries='x')": (lambda: ew.submit(abs, [1], retries="x"), ConfigError),
        "submit(seed='x')": (lambda: ew.submit(abs, [1], seed="x"), ConfigError),
        "submit(seed=-1)": (lambda: ew.submit(abs, [1], seed=-1), ConfigError),
        "submit(name=5)": (lambda: ew.submit(abs, [1], name=5), ConfigError),
        "submit(name='')": (lambda: ew.submit(abs, [1], name=""), ConfigError),
        "submit(name='a\\nb')": (lambda: ew.submit(abs, [1], name="a\nb"), ConfigError),
        "submit(tag=5)": (lambda: ew.submit(abs, [1], tag=5), ConfigError),
        "submit(env=5)": (lambda: ew.submit(abs, [1], env=5), ConfigError),
        "submit(env={1: 'x'})": (lambda: ew.submit(abs, [1], env={1: "x"}), ConfigError),
        "submit(env={'A=B': 'x'})": (lambda: ew.submit(abs, [1], env={"A=B": "x"}), ConfigError),
        "submit(env={'A': object()})": (
            lambda: ew.submit(abs, [1], env={"A": object()}),
            ConfigError,
        ),
        "submit(files=5)": (lambda: ew.submit(abs, [1], files=5), ConfigError),
        "submit(files=[5])": (lambda: ew.submit(abs, [1], files=[5]), ConfigError),
        "submit(files=b'f')": (lambda: ew.submit(abs, [1], files=b"f"), ConfigError),
        "submit(files=['/no/such/file'])": (
            lambda: ew.submit(abs, [1], files=["/no/such/file"]),
            ConfigError,
        ),
        "submit(storage=5)": (lambda: ew.submit(abs, [1], storage=5), ConfigError),
        "create_job(name=5)": (lambda: ew.create_job(name=5), ConfigError),
        "create_job(on=5)": (lambda: ew.create_job(on=5), ConfigError),
        "create_job(retries=-1)": (lambda: ew.create_job(retries=-1), ConfigError),
        "create_job().add_task(5)": (lambda: fresh().add_task(5), ConfigError),
        "create_job().submit() (no tasks)": (lambda: fresh().submit(), ConfigError),
        "submit_communicating(5, ranks=2)": (
            lambda: ew.submit_communicating(5, ranks=2),
            ConfigError,
        ),
        "submit_communicating(ranks=-2)": (
            lambda: ew.submit_communicating(abs, ranks=-2),
            ConfigError,
        ),
        "submit_communicating(ranks='x')": (
            lambda: ew.submit_communicating(abs, ranks="x"),
            ConfigError,
        ),
        "Executor(max_workers=-1)": (lambda: ew.Executor(max_workers=-1), ConfigError),
        "Executor(bogus=1)": (lambda: ew.Executor(bogus=1), ConfigError),
        # a missing job
        "recover('no-such-job')": (lambda: ew.recover("no-such-job"), JobNotFound),
        "recover('')": (lambda: ew.recover(""), JobNotFound),
        "recover(None)": (lambda: ew.recover(None), JobNotFound),
        "recover(5)": (lambda: ew.recover(5), JobNotFound),
        # a job's methods
        "job.wait(timeout='x')": (lambda: job.wait(timeout="x"), ConfigError),
        "job.wait(timeout=-1)": (lambda: job.wait(timeout=-1), ConfigError),
        "job.wait(state='bogus')": (lambda: job.wait(state="bogus"), ConfigError),
        "job.wait(state=5)": (lambda: job.wait(state=5), ConfigError),
        "job.log(99)": (lambda: job.log(99), NoSuchTask),
        "job.log(-1)": (lambda: job.log(-1), NoSuchTask),
        "job.log('x')": (lambda: job.log("x"), ConfigError),
        "job.retry(5)": (lambda: job.retry(5), ConfigError),
        "job.retry('01')": (lambda: job.retry("01"), ConfigError),
        "job.retry(['a'])": (lambda: job.retry(["a"]), ConfigError),
        "job.retry([1.0])": (lambda: job.retry([1.0]), ConfigError),
        "job.retry([True])": (lambda: job.retry([True]), ConfigError),
        "job.retry([99])": (lambda: job.retry([99]), NoSuchTask),
        "job.retry([-1])": (lambda: job.retry([-1]), NoSuchTask),
        "job.retry([0]) (finished)": (lambda: job.retry([0]), StateError),
        "Task(job, 99).cancel()": (lambda: ew.Task(job, 99).cancel(), NoSuchTask),
        "Task(job, 'x').cancel()": (lambda: ew.Task(job, "x").cancel(), ConfigError),
        "Task(job, -1).cancel()": (lambda: ew.Task(job, -1).cancel(), NoSuchTask),
        "job.get(errors='x')": (lambda: job.get(errors="x"), ConfigError),
        "job.add_task(abs) (submitted)": (lambda: job.add_task(abs), JobError),
    }


#: Cases that still raise a raw error, with the fix each needs: tried and tallied, not failed
#: on. None now: a raw error from any case fails the test; one added here while its fix waits
#: must leave once it is fixed (the test fails until it does).
KNOWN_GAPS: dict[str, str] = {}


def test_every_public_function_refuses_bad_input_with_its_own_error(ew_home, tally):
    job = ew.submit(abs, [1, -2, 3], name="bad-inputs")
    job.wait(timeout=60)
    raw, wrong, gaps_fixed = [], [], []
    for what, (call, expected) in _cases(job).items():
        tally.trial()
        try:
            call()
        except ew.ElsewhereError as exc:
            right = isinstance(exc, expected) and str(exc).strip()
            if what in KNOWN_GAPS:
                if right:
                    gaps_fixed.append(what)
            elif not right:
                wrong.append(f"{what}: {type(exc).__name__}: {exc} (wanted a {expected.__name__})")
        except Exception as exc:
            if what not in KNOWN_GAPS:
                raw.append(f"{what}: raw {type(exc).__name__}: {exc}")
        else:
            if what not in KNOWN_GAPS:
                wrong.append(f"{what}: no error")
    tally.tracebacks += len(raw)
    tally.notes += raw + wrong
    print(f"\nbad inputs: {len(KNOWN_GAPS) - len(gaps_fixed)} known gaps still open"
          + (f"; fixed now (remove from KNOWN_GAPS): {', '.join(gaps_fixed)}" if gaps_fixed else ""))  # fmt: skip
    assert not raw and not wrong, "\n".join(raw + wrong)
    assert not gaps_fixed, f"fixed now, remove from KNOWN_GAPS: {', '.join(gaps_fixed)}"
    # no job was made of bad input
    assert {j["name"] for j in ew.jobs(refresh=False)} == {"bad-inputs"}


def test_friendly_inputs_are_taken(ew_home, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("x")
    job = ew.submit(_env, ["OMP_NUM_THREADS"], env={"OMP_NUM_THREADS": 1}, tag="", name="friendly",
                    files=str(data))  # one path: a list of it, not of its characters
    assert job.wait(timeout="1min").results() == ["1"]  # a number in env= is written as its text
    assert [p.name for p in (job.path / "files").iterdir()] == ["data.txt"]
    assert job.wait(timeout=0, state=ew.JobState.FINISHED) is job  # a duration, a JobState
    np = pytest.importorskip("numpy")

    failed = ew.submit(_fail, [0, 1], name="retry-numpy").wait(timeout=60)
    assert failed.state is ew.JobState.FAILED
    failed.retry(np.array([1]))  # NumPy's integers are task indices
    assert failed.wait(timeout=60).tasks[1].state is ew.TaskState.FAILED


def _env(name):
    import os

    return os.environ.get(name)


def _fail(i):
    raise ValueError(i)
