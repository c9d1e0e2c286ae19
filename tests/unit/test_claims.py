"""A worker's claims (run/claims.py): the first is one task, unless a warm worker knows the
function from its last job; then an even share of the work outstanding between the workers that
joined or are on their way."""

import fcntl
import os

import pytest

from elsewhere.folder.queue import new_queue, write_queue
from elsewhere.folder.store import JobStore
from elsewhere.run.claims import Claims


@pytest.fixture
def store(tmp_path):
    (tmp_path / "queue.lock").touch()
    (tmp_path / "journal").mkdir()
    s = JobStore(str(tmp_path))
    write_queue(s, new_queue(1000, max_workers=4), 1, 0)
    with s.locked_queue() as q:
        q.submit()
    return s


def _join(store, wid, guess_s=0.0):
    return Claims(store, wid).join(pid=1, host="h", lock="l", fifo="", mean_s=0.0, n_done=0, guess_s=guess_s)


def test_a_first_claim_is_one_task_when_the_function_is_unknown(store):
    assert _join(store, "a") == range(0, 1)


def test_a_known_fast_function_takes_an_even_share_of_the_workers_joined_and_on_their_way(store):
    with store.locked_queue() as q:
        q.note_dispatched(["b", "c", "d"], 0.0)  # four workers for the job: this one and three coming
    assert _join(store, "a", guess_s=1e-6) == range(0, 250)
    # the next to arrive: a fourth of the work outstanding, the 750 left and the 250 the first
    # holds (a fourth of the 750 alone would leave it short, and make it claim again)
    assert _join(store, "b", guess_s=1e-6) == range(250, 500)


def test_two_warm_workers_handed_a_job_at_once_take_half_each(store):
    # the second to join counts the first's claim as work outstanding: half of the job each,
    # one claim apiece, and they end together
    with store.locked_queue() as q:
        q.note_dispatched(["b"], 0.0)
    assert _join(store, "a", guess_s=1e-6) == range(0, 500)
    assert _join(store, "b", guess_s=1e-6) == range(500, 1000)


def test_the_guess_sizes_the_claim_to_about_20_ms_of_its_tasks(store):
    assert _join(store, "a", guess_s=0.001) == range(0, 20)
    assert _join(store, "b", guess_s=5.0) == range(20, 21)  # slow tasks: one at a time, as ever


def test_a_guessed_claim_takes_no_more_than_what_is_left(store):
    with store.locked_queue() as q:
        q.take_next(999)
    assert _join(store, "a", guess_s=1e-6) == range(999, 1000)


def test_a_claim_that_takes_the_last_tasks_says_the_queue_is_drained(store):
    # (the worker then wakes a client waiting for the job's end at once: run/jobrun.py)
    with store.locked_queue() as q:
        q.note_dispatched(["b", "c", "d"], 0.0)
    c = Claims(store, "a")
    assert c.join(pid=1, host="h", lock="l", fifo="", mean_s=0.0, n_done=0, guess_s=1e-6) == range(0, 250)
    assert not c.drained  # 750 left for the others
    with store.locked_queue() as q:
        q.take_next(700)
    assert c.claim(1e-6, 250) == range(950, 1000) and c.drained
    assert c.claim(1e-6, 300) is None and not c.drained  # nothing taken: nothing to tell


def test_a_task_held_for_a_rerun_keeps_the_queue_from_being_drained(store):
    c = Claims(store, "a")
    c.join(pid=1, host="h", lock="l", fifo="", mean_s=0.0, n_done=0)
    with store.locked_queue() as q:
        q.rerun_later(0, 1, 1e12, by="a")  # task 0 raised and runs again, much later
        q.take_next(900)
    assert c.claim(1e-6, 10) == range(901, 1000) and not c.drained


def test_a_claim_that_finds_nothing_left_tells_first_then_leaves(store):
    # A worker whose claim did not drain the queue may still be the last to end: it tells its
    # client of its last results (on_empty) as soon as it sees nothing left, before the lost
    # members are looked for and the queue is written, which took it 0.1-0.4 ms more
    lock = os.path.join(store.dir, "a.cur")  # held, as a live worker's
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    c = Claims(store, "a")
    assert c.join(pid=1, host="h", lock=lock, fifo="", mean_s=0.0, n_done=0, guess_s=1e-6) == range(0, 1000)
    seen = []
    c.on_empty = lambda: seen.append(store.queue().members["a"]["state"])
    assert c.claim(1e-6, 1000) is None and c.left
    assert seen == ["active"] and store.queue().members["a"]["state"] == "left"
    os.close(fd)
