"""The batch backend's job_state is a query, poll acts: what the scheduler says of elements is
read by both, but only poll reports lost tasks and cancels what can never start.

The scheduler's statuses are given (no scheduler runs): the job folder is real, made the way
a submission makes it."""

from __future__ import annotations

import pytest

import elsewhere as ew
from elsewhere.backends.schedulers import SlurmCluster
from elsewhere.folder.records import Kind
from elsewhere.folder.store import write_json
from elsewhere.schedulers import NativeStatus
from elsewhere.util.states import TaskState


class Told(SlurmCluster):
    """SLURM as far as its statuses and cancels go: what the test says, what it was asked."""

    said: dict[str, NativeStatus] = {}

    def __init__(self, **kw):
        super().__init__(check=False, **kw)
        self.cancelled: list[list[str]] = []

    def statuses(self, job_ids, *, force=False):
        return dict(self.said)

    def _cancel(self, ids):
        self.cancelled.append(list(ids))


@pytest.fixture
def submitted(ew_home):
    """A job of 4 tasks in two array elements (0: tasks 0-1, 1: tasks 2-3) of SLURM job 77."""
    cl = Told()
    job = ew.create_job(cl, name="told")
    h = job.handle
    (h.path / "submissions").mkdir(mode=0o700, exist_ok=True)
    write_json(h.path / "submissions" / "0.json", [[0, 2], [2, 4]])
    with h.store.locked_queue() as q:
        q.set_size(4)
        q.submit(assigned=4, max_workers=4)
    h.with_meta(h.store.update_meta(n_tasks=4, submitted=1.0))
    cl.set_job_cluster_data(h, {"submissions": [{"name": "0", "native_id": "77", "elements": 2, "tasks": 4,
                                                 "submitted": 0.0}]})  # fmt: skip
    return cl, h


def test_job_state_says_why_tasks_wait_and_changes_nothing(submitted):
    cl, h = submitted
    cl.said = {"77_0": NativeStatus("77_0", "PENDING", TaskState.PENDING, reason="Resources"),
               "77_1": NativeStatus("77_1", "FAILED", TaskState.FAILED, reason="NODE_FAIL", exit_code=1)}
    snap = h.snapshot()
    fresh = cl.job_state(h, snap)
    assert fresh is not snap and snap.reasons == {} and snap.note == ""
    assert fresh.reasons == {0: "pending: Resources", 1: "pending: Resources"}
    assert fresh.note == "2 pending: Resources"
    assert h.refresh().get(2) is None and cl.cancelled == []  # a query: nothing lost, nothing cancelled


def test_poll_reports_the_lost_and_cancels_what_never_starts(submitted):
    cl, h = submitted
    cl.said = {"77_0": NativeStatus("77_0", "PENDING", TaskState.PENDING, reason="PartitionConfig"),
               "77_1": NativeStatus("77_1", "FAILED", TaskState.FAILED, reason="NODE_FAIL", exit_code=1)}
    cl.poll(h)
    final = h.refresh()
    assert {t: final[t][1].kind for t in range(4)} == dict.fromkeys(range(4), Kind.LOST)
    assert cl.cancelled == [["77_0"]]
    q = h.store.queue()
    assert "ended (NODE_FAIL, exit code 1) without a result" in q.lost_reason(2)
    assert "can never start (PartitionConfig)" in q.lost_reason(0)
    assert h.state is ew.JobState.FAILED


def test_an_exit_code_above_128_is_named_as_the_signal_that_killed_the_element(submitted):
    cl, h = submitted
    cl.said = {"77_0": NativeStatus("77_0", "FAILED", TaskState.FAILED, reason="NonZeroExitCode", exit_code=139),
               "77_1": NativeStatus("77_1", "FAILED", TaskState.FAILED, reason="NonZeroExitCode", exit_code=3)}
    cl.poll(h)
    q = h.store.queue()
    assert "ended (NonZeroExitCode, exit code 139: killed by SIGSEGV (signal 11: a crash)) without a result" in q.lost_reason(0)
    assert "ended (NonZeroExitCode, exit code 3) without a result" in q.lost_reason(2)  # the task's own: as it is
