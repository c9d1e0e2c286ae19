"""``after=[job, ...]``: a job that runs only once the jobs it waits for finished OK, on every
backend of the conformance suite (conftest.py lists them).

Batch schedulers with a dependency of their own get it on the submit command line (checked
here on the command the cluster ran: SLURM's ``--dependency=afterok:ID``, SGE's
``-hold_jid``, PBS's ``-W depend=afterok:``, LSF's ``-w "done(ID)"``, Flux's
``--dependency=afterok:``); the library holds the job everywhere else (local workers, ssh nodes,
peers, HTCondor, the plugin). The fake LSF and Flux take the flag but do not hold a job for it
(tests/fakes): there, what runs when is not checked, only the command line and the outcome.
A task of a job that waits writes its start time (``retry_tasks.py``), so a test sees that it
started after the tasks it waited for ended.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import elsewhere as ew
from conformance.contract import Backend, folders, wait_until
from conformance.retry_tasks import fail_on, stamp, starts
from conformance.tasks import hold
from elsewhere.backends.batch import BatchCluster
from elsewhere.schedulers import get_syntax

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

END_S = 150  # how long two jobs, one after the other, may take on a loaded batch scheduler
#: backends whose scheduler takes a dependency but does not hold a job for it (the fakes)
NO_HOLD = ("lsf", "flux")


def _first_start(folder: Path, index: int) -> float:
    """When task ``index`` (of ``stamp``, ``fail_on``...) first started, by its starts file."""
    return float((folder / f"starts-{index}").read_text().splitlines()[0].split()[1])


def _wait_or_say(job: ew.Job, jobs: list[ew.Job], first: Path) -> None:
    """``job.wait``; past END_S, fail saying where each of ``jobs`` stands: its state and note,
    the tail of its controller's log where it has one (peers), and which of the first job's
    tasks started (a hang here once, in a full run, left nothing else to go by)."""
    try:
        job.wait(timeout=END_S)
    except ew.TimeoutError as exc:
        said = [str(exc), f"first job's task starts: {sorted(p.name for p in first.glob('starts-*'))}"]
        for j in jobs:
            st = j.check()
            said.append(f"{j.name}: {st.state.value} {st.counts} {st.note!r}")
            log = j.handle.store.path / "controller.log"
            if log.exists():
                said += ["  " + line for line in log.read_text(errors="replace").splitlines()[-15:]]
        raise AssertionError("\n".join(said)) from None


def _dependency_words(cluster: ew.Cluster, job: ew.Job) -> list[str] | None:
    """The words a batch cluster puts on the submit command line to wait for ``job``."""
    if not isinstance(cluster, BatchCluster):
        return None
    ids = [s["native_id"] for s in cluster.get_job_cluster_data(job.handle).get("submissions", [])]
    return cluster.syntax.build_dependency(ids)


def _submitted_with(cluster: ew.Cluster, words: list[str]) -> bool:
    """Whether one of the commands the batch cluster ran holds ``words``, in that order."""
    n = len(words)
    return any(argv[i : i + n] == words for argv in getattr(cluster, "commands_run", [])
               for i in range(len(argv) - n + 1))  # fmt: skip


def test_a_job_runs_once_the_jobs_it_waits_for_finished(backend: Backend, tmp_path: Path) -> None:
    cluster = backend()
    first, second, third = folders(tmp_path, "first", "second", "third")
    release = first / "release"  # a's tasks run until the command line was checked
    a = ew.submit(stamp, range(2), [str(first)] * 2, [0.5] * 2, [str(release)] * 2, on=cluster,
                  name=f"a-{tmp_path.name}")  # fmt: skip
    if getattr(getattr(cluster, "syntax", None), "build_dependency", None) is not None:
        # the scheduler holds b only if a's scheduler jobs are known when b is submitted (else
        # the library holds it, which is right too, but not what this test looks at)
        wait_until(lambda: a.handle.cluster_data().get("submissions"), 60, "a's submission")
    b = ew.submit(stamp, range(2), [str(second)] * 2, on=cluster, after=[a])  # a Job
    c = ew.submit(
        stamp, range(2), [str(third)] * 2, on=cluster, after=[a.name, b]
    )  # a name, and a Job
    words = _dependency_words(cluster, a)
    if words is not None:  # the scheduler holds b: its own flag is on b's submit command line
        assert _submitted_with(cluster, words), (words, getattr(cluster, "commands_run", None))
    release.touch()
    for job in (a, b, c):  # (where the scheduler holds nothing, the fakes', c may end first)
        _wait_or_say(job, [a, b, c], first)
        assert job.state is ew.JobState.FINISHED, job.check()
    if backend.name in NO_HOLD:
        return
    a_ended = max(a.results())
    assert min(_first_start(second, i) for i in range(2)) >= a_ended - 0.01  # (file times: ms)
    assert min(_first_start(third, i) for i in range(2)) >= max(b.results()) - 0.01


def test_a_job_waiting_for_one_that_fails_is_cancelled_with_a_reason_naming_it(
        backend: Backend, tmp_path: Path) -> None:  # fmt: skip
    cluster = backend()
    bad, waits, waits_too = folders(tmp_path, "bad", "waits", "waits-too")
    c = ew.submit(fail_on, range(2), [str(bad)] * 2, [1] * 2, on=cluster, name=f"c-{tmp_path.name}")
    e = ew.submit(hold, [str(waits)] * 2, range(2), on=cluster, after=c, name=f"e-{tmp_path.name}")
    f = ew.submit(hold, [str(waits_too)] * 2, range(2), on=cluster, after=[e])
    f.wait(timeout=END_S)
    assert c.state is ew.JobState.FAILED
    for job, upstream, said in ((e, c, "failed"), (f, e, "was cancelled")):
        assert job.state is ew.JobState.CANCELLED, job.check()
        assert f"job {upstream.name!r}, which it waits for, {said}" in job.check().note
        for err in job.results():
            assert isinstance(err, ew.TaskError) and err.reason == "cancelled", repr(err)
            assert repr(upstream.name) in err.message, err.message
    if backend.name not in NO_HOLD:
        assert not any(
            (waits / f"pid-{i}").exists() or (waits_too / f"pid-{i}").exists() for i in range(2)
        )


def test_cancelling_a_job_cancels_the_jobs_that_wait_for_it(
    backend: Backend, tmp_path: Path
) -> None:
    cluster = backend()
    first, second, third = folders(tmp_path, "first", "second", "third")
    g = ew.submit(hold, [str(first)] * 2, range(2), on=cluster, name=f"g-{tmp_path.name}")
    h = ew.submit(hold, [str(second)] * 2, range(2), on=cluster, after=[g])
    i = ew.submit(hold, [str(third)] * 2, range(2), on=cluster, after=[h])
    g.cancel()
    i.wait(timeout=END_S)
    for job, upstream in ((h, g), (i, h)):
        assert job.state is ew.JobState.CANCELLED, job.check()
        assert f"job {upstream.name!r}, which it waits for, was cancelled" in job.check().note
    if backend.name not in NO_HOLD:
        assert not any(
            (second / f"pid-{k}").exists() or (third / f"pid-{k}").exists() for k in range(2)
        )


@pytest.mark.parametrize(("name", "options", "ids", "words"), [
    ("slurm", {}, ["12", "13"], ["--dependency=afterok:12:13"]),
    ("sge", {}, ["12", "13"], ["-hold_jid", "12,13"]),
    ("pbs", {}, ["12[].srv", "13.srv"], ["-W", "depend=afterok:12[].srv:13.srv"]),
    ("pbs", {"variant": "torque"}, ["12[].srv", "13.srv"], ["-W", "depend=afterok:13.srv,afterokarray:12[].srv"]),
    ("slurm-torque", {}, ["12"], ["-W", "depend=afterok:12"]),
    ("lsf", {}, ["12", "13"], ["-w", "done(12) && done(13)"]),
    ("flux", {}, ["\u0192A1,\u0192A2", "\u0192B1@1"], ["--dependency=afterok:\u0192A1", "--dependency=afterok:\u0192A2",
                                                    "--dependency=afterok:\u0192B1"]),
    ("htcondor", {}, ["12"], None),  # DAGMan is heavy: the library holds the job
])  # fmt: skip
def test_each_scheduler_has_its_own_dependency_flag(name: str, options: dict[str, str], ids: list[str],
                                                    words: list[str] | None) -> None:  # fmt: skip
    assert get_syntax(name, **options).build_dependency(ids) == words


def test_after_names_jobs_that_exist(ew_home: Path) -> None:
    with pytest.raises(ew.JobNotFound, match="no job named 'no-such-job'"):
        ew.create_job(ew.local(cores=1), after="no-such-job")
    with pytest.raises(ew.ConfigError, match="after= takes jobs"):
        ew.create_job(ew.local(cores=1), after=[3])  # type: ignore[list-item]


def test_waiting_tasks_never_start_before_release(ew_home: Path, tmp_path: Path) -> None:
    """On local workers: while the job it waits for runs, a held job is pending, says what it
    waits for, and has no worker; it starts once that job finished."""
    cluster = ew.local(cores=2)
    first, second = folders(tmp_path, "first", "second")
    a = ew.submit(hold, [str(first)] * 2, range(2), on=cluster)
    b = ew.submit(stamp, range(2), [str(second)] * 2, on=cluster, after=a)
    st = b.check()
    assert st.state is ew.JobState.PENDING and st.counts["pending"] == 2, st
    assert f"waiting for job {a.name!r} to finish" in st.note
    assert starts(second, 0) == 0 and not b.handle.store.queue().submitted
    (first / "release").touch()
    b.wait(timeout=30)
    assert b.state is ew.JobState.FINISHED and starts(second, 0) == 1
