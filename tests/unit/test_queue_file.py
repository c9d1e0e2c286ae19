"""queue.json: two checksummed slots written in place; the newest whole one is the state."""

import json
import shutil
import threading

import pytest

from elsewhere.folder.queue import QUEUE, QUEUE_B, new_queue, read_queue, write_queue
from elsewhere.folder.store import JobStore


@pytest.fixture
def store(tmp_path):
    (tmp_path / "queue.lock").touch()
    s = JobStore(str(tmp_path))
    write_queue(s, new_queue(10), 1, 0)
    return s


def test_updates_alternate_slots_and_the_newest_wins(store, tmp_path):
    inode = (tmp_path / QUEUE).stat().st_ino
    for k in range(1, 6):
        with store.locked_queue() as q:
            q.d["next"] = k
        assert store.queue().next == k
    gen, _, q = read_queue(store)
    assert gen == 6 and q["next"] == 5
    assert (tmp_path / QUEUE).stat().st_ino == inode  # written in place, never replaced
    assert {json.loads(p.read_bytes().split(b"\n", 1)[1])["next"] for p in (tmp_path / QUEUE, tmp_path / QUEUE_B)} \
        == {4, 5}


def test_a_torn_write_leaves_the_state_before_it(store, tmp_path):
    with store.locked_queue() as q:
        q.d["next"] = 3  # generation 2, in queue.b.json
    gen, slot, _ = read_queue(store)
    assert (gen, slot) == (2, 1)
    # the next update goes over the older slot (queue.json); a crash cuts it short
    with store.locked_queue() as q:
        q.d["next"] = 7
    full = (tmp_path / QUEUE).read_bytes()
    (tmp_path / QUEUE).write_bytes(full[: len(full) - 5])
    assert store.queue().next == 3  # the slot that was whole
    with store.locked_queue() as q:  # and the next writer goes on from it
        assert q.d["next"] == 3
        q.d["next"] = 4
    assert store.queue().next == 4


def test_a_job_folder_from_before_the_slots_is_read_and_updated(tmp_path):
    (tmp_path / "queue.lock").touch()
    (tmp_path / QUEUE).write_text(json.dumps(new_queue(5)))
    s = JobStore(str(tmp_path))
    assert s.queue().n == 5
    with s.locked_queue() as q:
        q.d["next"] = 2
    assert s.queue().next == 2 and (tmp_path / QUEUE_B).exists()


def test_no_queue_and_a_damaged_one_are_told_apart(tmp_path):
    s = JobStore(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        read_queue(s)
    (tmp_path / QUEUE).write_bytes(b"EWQ1 3 10 00000000\ngarbage!!!")
    with pytest.raises(ValueError, match="damaged"):
        read_queue(s)


def test_readers_without_the_lock_never_see_a_half_written_state(store):
    stop = threading.Event()
    seen = []

    def read():
        while not stop.is_set():
            q = store.queue()
            seen.append(q.d["next"] == len(q.d["retry"]))  # the writer keeps these equal

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    try:
        for k in range(300):
            with store.locked_queue() as q:
                q.d["next"] = k
                q.d["retry"] = list(range(k))
    finally:
        stop.set()
        for t in readers:
            t.join(30)
    assert seen and all(seen)


def test_a_worker_holding_the_queue_open_sees_its_folder_removed(store):
    # A worker keeps queue.lock and both slots open while it is in a job; once the
    # folder is removed (purged), its next claim fails as one by path would.
    open(store._p(QUEUE_B), "wb").close()
    store.hold_queue()
    try:
        with store.locked_queue() as q:
            q.d["next"] = 3
        assert read_queue(store)[2]["next"] == 3
        shutil.rmtree(store.dir)
        with pytest.raises(FileNotFoundError), store.locked_queue():
            pass
    finally:
        store.release_queue()
