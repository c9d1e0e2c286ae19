"""The state vocabulary: forward moves only, job state derived from task counts."""

from __future__ import annotations

from elsewhere.util.states import JobState, TaskState, can_move, count_states, derive_job_state


def test_forward_only():
    assert can_move(TaskState.PENDING, TaskState.RUNNING)
    assert not can_move(TaskState.RUNNING, TaskState.QUEUED)
    assert not can_move(TaskState.FINISHED, TaskState.RUNNING)
    assert not can_move(TaskState.FAILED, TaskState.QUEUED)
    assert can_move(TaskState.FAILED, TaskState.QUEUED, retry=True)


def test_job_state_from_counts():
    c = count_states
    assert derive_job_state(c([])) is JobState.PENDING
    assert derive_job_state(c([TaskState.QUEUED] * 2)) is JobState.QUEUED
    assert derive_job_state(c([TaskState.QUEUED, TaskState.FINISHED])) is JobState.RUNNING
    assert derive_job_state(c([TaskState.FINISHED] * 3)) is JobState.FINISHED
    assert derive_job_state(c([TaskState.FINISHED, TaskState.FAILED])) is JobState.FAILED
    assert derive_job_state(c([TaskState.CANCELLED, TaskState.FAILED])) is JobState.CANCELLED
    assert JobState.FAILED.done and not JobState.RUNNING.done
