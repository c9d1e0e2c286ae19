"""A pool worker's kit (run/kit.py): its files for the next job, made while idle, renamed into
the job it joins; new files every time, never one that a job had before."""

import os

import pytest

from elsewhere.run.kit import FILES, FileKit, open_new, remove_kit


@pytest.fixture
def kit(tmp_path):
    k = FileKit(str(tmp_path / "pool"), "w1")
    yield k
    k.discard()


def _kit_files(kit):
    return sorted(os.listdir(kit.folder)) if os.path.isdir(kit.folder) else []


def test_a_kit_holds_a_new_open_file_for_each_of_a_jobs_files(kit):
    kit.fill()
    assert _kit_files(kit) == sorted(f"w1.{name}" for name in FILES)
    assert all(os.fstat(fd).st_size == 0 for _, fd in kit.ready.values())


def test_a_file_taken_from_the_kit_is_renamed_into_the_job_and_written_there(kit, tmp_path):
    kit.fill()
    made = os.fstat(kit.ready["log"][1]).st_ino
    target = str(tmp_path / "job-log")
    fd = kit.take("log", target)
    os.write(fd, b"hello\n")
    os.close(fd)
    assert open(target, "rb").read() == b"hello\n" and os.stat(target).st_ino == made
    assert "log" not in kit.ready and "w1.log" not in _kit_files(kit)
    kit.fill()  # the next: a file of its own, new
    assert os.fstat(kit.ready["log"][1]).st_ino != made


def test_a_jobs_file_that_exists_is_never_replaced_the_worker_opens_it(kit, tmp_path):
    # a worker that ran in the job before (a retry): its journal goes on, results and all
    target = tmp_path / "journal"
    target.write_bytes(b"earlier records")
    kit.fill()
    assert kit.take("journal", str(target)) == -1 and "journal" in kit.ready
    fd = open_new(kit, "journal", str(target))
    os.write(fd, b", more")
    os.close(fd)
    assert target.read_bytes() == b"earlier records, more"


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm: no second file system to try")
def test_jobs_on_another_file_system_turn_kits_off(kit, tmp_path):
    if os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the file system of the test's folder")
    kit.fill()
    target = os.path.join("/dev/shm", f"ew-kit-test-{os.getpid()}")
    try:
        fd = open_new(kit, "results", target)  # the rename fails (EXDEV): made in place
        os.close(fd)
        assert os.path.exists(target) and kit.off and "w1.results" not in _kit_files(kit)
        kit.fill()
        assert "results" not in kit.ready  # no more kits
    finally:
        os.unlink(target)


def test_a_worker_that_leaves_removes_its_kit_and_a_client_removes_a_killed_ones(tmp_path):
    pool = tmp_path / "pool"
    a, b = FileKit(str(pool), "a"), FileKit(str(pool), "b")
    a.fill()
    b.fill()
    a.discard()
    assert _kit_files(b) == sorted(f"b.{name}" for name in FILES)
    remove_kit(pool, "b")  # (b was killed: its descriptors died with it)
    assert _kit_files(b) == []
    b.discard()


def test_a_kit_that_cannot_be_made_leaves_the_files_made_in_place_and_is_tried_again(kit, tmp_path):
    (tmp_path / "pool").mkdir()
    (tmp_path / "pool" / "kit").write_text("in the way")  # (a full disk, a folder not ours)
    kit.fill()
    assert kit.ready == {} and not kit.off
    fd = open_new(kit, "log", str(tmp_path / "log"))
    os.close(fd)
    assert (tmp_path / "log").exists()
    (tmp_path / "pool" / "kit").unlink()
    kit.fill()  # the next idle spell: room again
    assert sorted(kit.ready) == sorted(FILES)
