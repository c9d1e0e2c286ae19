"""A user's own scheduler on the generic interface: examples/nohup_scheduler.py.

It is found the three ways a user names one: by "module:Class", through a profile, and
through the entry-point group ``elsewhere.schedulers`` (a temporary dist-info folder on
sys.path stands in for an installed package). A scheduler *syntax* registered alone gets
the shared batch base (tried on the real SGE).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import elsewhere as ew
from elsewhere.backends import cluster_class

REPO = Path(__file__).resolve().parents[2]
TARGET = "examples.nohup_scheduler:NohupCluster"

sys.path.insert(0, str(REPO / "tests"))
import services

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def importable_examples(monkeypatch):
    """``examples`` importable here and in the processes the tests start."""
    monkeypatch.syspath_prepend(str(REPO))
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(REPO) + (os.pathsep + old if old else ""))


@pytest.fixture
def entry_points(tmp_path, monkeypatch):
    """Register entry points of group elsewhere.schedulers without installing anything."""

    def register(**names: str) -> None:
        dist = tmp_path / "site" / "ew_user_plugins-0.1.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: ew-user-plugins\nVersion: 0.1\n"
        )
        lines = "".join(f"{k} = {v}\n" for k, v in names.items())
        (dist / "entry_points.txt").write_text(f"[elsewhere.schedulers]\n{lines}")
        monkeypatch.syspath_prepend(str(tmp_path / "site"))

    return register


def square(x):
    print(f"squaring {x}")
    return x * x


def sleepy(x):
    time.sleep(x)
    return x


def _procs(cl, job):
    return cl.get_job_cluster_data(job.handle)["processes"]


def _wait(cond, what, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what()
        time.sleep(0.1)


def test_by_module_path(ew_home):
    cls = cluster_class(TARGET)
    assert issubclass(cls, ew.Cluster) and cls.kind == "nohup"
    cl = ew.batch(TARGET, slots=3)
    assert type(cl) is cls
    job = ew.submit(square, range(7), on=cl)
    job.wait(timeout=30)
    assert job.results() == [x * x for x in range(7)]
    assert "squaring 6" in job.log(6)
    assert [p["tasks"] for p in _procs(cl, job)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert ew.map(square, range(5), on=cl) == [0, 1, 4, 9, 16]


def test_by_entry_point(ew_home, entry_points):
    entry_points(nohup=TARGET)
    cl = ew.batch("nohup", slots=2)
    assert type(cl).__name__ == "NohupCluster"
    assert ew.map(square, range(4), on=cl) == [0, 1, 4, 9]
    with pytest.raises(ew.ConfigError, match=r"unknown cluster kind 'nohup2'.*nohup"):
        ew.batch("nohup2")


def test_by_profile(ew_home, tmp_path, monkeypatch):
    monkeypatch.setenv("ELSEWHERE_CONFIG", str(tmp_path / "cfg"))
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.toml").write_text(
        textwrap.dedent(f"""
        [profiles.bg]
        scheduler = "{TARGET}"
        slots = 2
        [profiles.bg.additional_properties]
        nice = 5
    """)
    )
    assert ew.map(square, [5, 6], on="bg") == [25, 36]
    cl = ew.cluster("bg")
    assert cl.slots == 2 and cl.additional_properties == {"nice": 5}


def test_bad_settings_are_refused(ew_home):
    with pytest.raises(ew.ConfigError, match="slots"):
        ew.batch(TARGET, slots=0)
    with pytest.raises(ew.ConfigError, match="not an executable"):
        ew.batch(TARGET, python="/no/such/python")
    with pytest.raises(ew.ConfigError, match="cannot load the cluster class"):
        cluster_class("examples.nohup_scheduler:NoSuchCluster")


def test_killed_process_loses_its_tasks_with_reason_others_kept(ew_home):
    cl = ew.batch(TARGET, slots=3)
    job = ew.submit(sleepy, [0, 60, 0], on=cl)
    victim = _procs(cl, job)[1]
    assert victim["tasks"] == [1]
    _wait(lambda: job.check().counts["finished"] == 2, job.check)
    os.killpg(victim["pid"], signal.SIGKILL)
    job.wait(timeout=30)
    res = job.results()
    assert res[0] == 0 and res[2] == 0
    assert isinstance(res[1], ew.TaskError) and res[1].reason == "lost"
    assert f"pid {victim['pid']}" in res[1].message
    assert job.check().state is ew.JobState.FAILED


def test_cancel_stops_the_processes(ew_home):
    cl = ew.batch(TARGET, slots=2)
    job = ew.submit(sleepy, [60, 60], on=cl)
    pids = [p["pid"] for p in _procs(cl, job)]
    started = job.path / "workers"
    _wait(lambda: len(list(started.glob("*.cur"))) == 2, job.check)  # both tasks have begun
    job.cancel()
    assert job.check().state is ew.JobState.CANCELLED
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    job.purge()


CLIENT = f"""
import time
import elsewhere as ew
def slow(x):
    time.sleep(0.5)
    return -x
ew.submit(slow, range(4), name="nohup-detached", on=ew.batch("{TARGET}", slots=2))
print("ok", flush=True)
"""


def test_recover_from_a_new_process(ew_home, tmp_path):
    script = tmp_path / "c.py"
    script.write_text(CLIENT)
    subprocess.run([sys.executable, str(script)], check=True, timeout=30, env=dict(os.environ))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import elsewhere as ew; j = ew.recover('nohup-detached'); "
            "print(type(j.cluster).__name__, flush=True); j.wait(timeout=30, progress=False); print(j.results())",
        ],
        capture_output=True,
        text=True,
        timeout=45,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["NohupCluster", "[0, -1, -2, -3]"]


def test_a_scheduler_syntax_alone_gets_the_batch_base(ew_home, entry_points):
    if services.sge() is None:
        pytest.skip(services.why_no_sge())
    entry_points(mysge="elsewhere.schedulers.sge:SGESyntax")
    cl = ew.batch("mysge", status_interval_s=0.5)
    assert type(cl).__name__ == "SGESyntaxCluster" and cl.syntax.submit_command == "qsub"
    assert ew.map(square, range(3), on=cl) == [0, 1, 4]
    assert [c[0] for c in cl.commands_run].count("qsub") == 1


# -- the plugin contract: what the library does for a plugin, whatever it starts ---------------


def flaky(marker):
    """Fails on its first run, succeeds on the next (the marker file remembers)."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first attempt fails")
    return "second attempt"


def sleepy_once(marker):
    """Sleeps (to be killed) on its first run, returns at once on the next."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(60)
    return "rerun"


def test_tasks_of_a_plugin_show_running_while_they_run(ew_home):
    cl = ew.batch(TARGET, slots=2)
    job = ew.submit(sleepy, [60, 60], on=cl)
    _wait(lambda: job.check().counts["running"] == 2, job.check)
    assert [t.state for t in job.tasks] == [ew.TaskState.RUNNING] * 2
    job.cancel()
    assert job.check().state is ew.JobState.CANCELLED


def test_cancelling_one_task_of_a_plugin_leaves_the_others_to_finish(ew_home):
    cl = ew.batch(TARGET, slots=4)
    job = ew.submit(sleepy, [0, 60, 0, 0], on=cl)
    _wait(lambda: job.tasks[1].state is ew.TaskState.RUNNING, job.check)
    assert job.tasks[1].cancel() is True
    job.wait(timeout=30)
    assert job.tasks[1].state is ew.TaskState.CANCELLED
    assert job.check().state is ew.JobState.FINISHED
    assert job.results(partial=True)[0] == 0 and job.results(partial=True)[3] == 0
    assert job.tasks[0].cancel() is False  # it has ended: nothing to cancel


def test_a_lost_task_of_a_plugin_runs_again_while_retries_last(ew_home, tmp_path):
    cl = ew.batch(TARGET, slots=1)
    job = ew.submit(sleepy_once, [str(tmp_path / "m")], on=cl, retries=1)
    _wait(lambda: (tmp_path / "m").exists() and job.tasks[0].state is ew.TaskState.RUNNING, job.check)
    os.killpg(_procs(cl, job)[0]["pid"], signal.SIGKILL)
    job.wait(timeout=30)
    assert job.results() == ["rerun"]
    assert len(_procs(cl, job)) == 2  # submit_independent was asked for exactly the lost task
    assert _procs(cl, job)[1]["tasks"] == [0]


def test_retry_of_a_failed_task_reaches_the_plugin(ew_home, tmp_path):
    cl = ew.batch(TARGET, slots=2)
    job = ew.submit(flaky, [str(tmp_path / "a"), str(tmp_path / "b")], on=cl)
    job.wait(timeout=30)
    assert job.check().state is ew.JobState.FAILED
    (tmp_path / "b").unlink()  # task 1 fails again; only task 0 is asked for
    job.retry([0])
    job.wait(timeout=30)
    assert job.results()[0] == "second attempt"
    assert _procs(cl, job)[-1]["tasks"] == [0]
    with pytest.raises(ew.StateError, match="cannot move from finished"):
        job.retry([0])


class Fussy(__import__("examples.nohup_scheduler", fromlist=["NohupCluster"]).NohupCluster):
    """A plugin whose post_construct fails when told to (a command missing on this machine)."""

    calls = 0

    def post_construct(self) -> None:
        type(self).calls += 1
        if os.environ.get("FUSSY_FAILS"):
            raise ew.ConfigError("the fussy command is missing here")


def test_post_construct_runs_for_a_new_cluster_not_for_reading_a_job(ew_home, monkeypatch):
    from elsewhere.backends import from_description

    Fussy.calls = 0
    cl = Fussy(slots=1)
    assert Fussy.calls == 0  # made, not used yet
    job = ew.submit(square, [3], on=cl, name="fussy")
    assert Fussy.calls == 1
    ew.submit(square, [4], on=cl).wait(timeout=30)
    assert Fussy.calls == 1  # once per cluster object
    job.wait(timeout=30)
    monkeypatch.setenv("FUSSY_FAILS", "1")
    from_description(cl.describe())  # rebuilt only to read: no check
    assert ew.recover("fussy").results() == [9]
    with pytest.raises(ew.ConfigError, match="fussy command is missing"):
        ew.submit(square, [5], on=Fussy(slots=1))


def test_additional_properties_are_checked_against_what_the_plugin_reads(ew_home):
    with pytest.raises(ew.ConfigError, match=r"unknown additional property 'nicee'.*nice \(the niceness"):
        ew.batch(TARGET, additional_properties={"nicee": 3})
    with pytest.raises(ew.ConfigError, match=r"'nice' of the nohup cluster must be int, not '3'"):
        ew.batch(TARGET, additional_properties={"nice": "3"})
    assert ew.batch(TARGET).additional_properties == {"nice": 0}


def test_an_unknown_scheduler_names_the_group_and_the_interpreter(ew_home):
    with pytest.raises(ew.ConfigError) as err:
        ew.batch("tsp")
    assert "'elsewhere.schedulers'" in str(err.value) and sys.executable in str(err.value)


def test_an_executor_runs_on_a_plugin_with_the_stream_capability(ew_home):
    with ew.Executor(on=ew.batch(TARGET, slots=2)) as ex:
        assert [f.result(timeout=30) for f in [ex.submit(pow, 2, k) for k in range(5)]] == [1, 2, 4, 8, 16]


class NoStream(__import__("examples.nohup_scheduler", fromlist=["NohupCluster"]).NohupCluster):
    capabilities = frozenset()


def test_a_plugin_without_a_capability_is_refused_clearly(ew_home):
    with pytest.raises(ew.ConfigError, match=r"cannot run an Executor.*'stream'"):
        ew.Executor(on=NoStream(slots=1))
    with pytest.raises(ew.ConfigError, match="cannot run communicating jobs"):
        ew.submit_communicating(square, (2,), ranks=2, on=NoStream(slots=1))


class HalfSubmits(__import__("examples.nohup_scheduler", fromlist=["NohupCluster"]).NohupCluster):
    """Starts its first process, then fails: the library must have it take that one back."""

    def submit_independent(self, job):
        super().submit_independent(job.for_tasks(job.tasks[:1]))
        raise ew.SchedulerError("the second submission was refused")


def test_a_submission_that_fails_halfway_is_taken_back(ew_home):
    cl = HalfSubmits(slots=1)
    with pytest.raises(ew.SchedulerError, match="second submission"):
        ew.submit(sleepy, [60, 60], on=cl, name="half")
    with pytest.raises(ew.JobNotFound):
        ew.recover("half")
    stray = [p for p in psutil.process_iter(["cmdline"]) if "elsewhere.worker" in " ".join(p.info["cmdline"] or [])
             and str(ew_home) in " ".join(p.info["cmdline"] or [])]
    assert not [p for p in stray if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
