"""Spare job folders and background removal (elsewhere.folder.housekeeping)."""

import os
import stat
import subprocess
import sys
import textwrap
import time

from elsewhere.folder import housekeeping
from elsewhere.folder.lifecycle import remove_folder


def wait_for(cond, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def spares(root):
    try:
        return [n for n in os.listdir(root / housekeeping.SPARES) if not n.startswith(".")]
    except FileNotFoundError:
        return []


def complete(path):
    return (all((path / s).is_dir() for s in housekeeping.SUBDIRS)
            and all((path / f).is_file() for f in housekeeping.FILES)
            and stat.S_ISFIFO(os.stat(path / housekeeping.NOTIFY).st_mode))


def test_the_next_job_folder_is_a_spare_made_ahead(tmp_path):
    housekeeping.make_job_folder(tmp_path / "job1")  # no spare yet: built in place
    assert complete(tmp_path / "job1")
    wait_for(lambda: len(spares(tmp_path)) == 1)  # the next one, made in the background
    spare = tmp_path / housekeeping.SPARES / spares(tmp_path)[0]
    assert complete(spare) and stat.S_IMODE(spare.stat().st_mode) == 0o700
    inode = spare.stat().st_ino
    housekeeping.make_job_folder(tmp_path / "job2")
    assert (tmp_path / "job2").stat().st_ino == inode  # renamed into place, not built
    assert complete(tmp_path / "job2")
    wait_for(lambda: len(spares(tmp_path)) == 1)  # and one more made for the job after


def test_a_purged_folder_is_gone_at_once_and_its_bytes_later(tmp_path):
    job = tmp_path / "job"
    housekeeping.make_job_folder(job)
    (job / "results" / "w.bin").write_bytes(b"x" * 1000)
    remove_folder(job)
    assert not job.exists()  # the name is free at once
    wait_for(lambda: not [n for n in os.listdir(tmp_path) if ".purged-" in n])


def test_removals_left_at_exit_are_done_before_the_process_ends(tmp_path):
    script = textwrap.dedent(f"""
        import threading
        from pathlib import Path
        from elsewhere.folder import housekeeping
        from elsewhere.folder.lifecycle import remove_folder
        import os
        root = Path({str(tmp_path)!r})
        # as if the background thread were busy elsewhere: the removals must happen at exit
        housekeeping._thread, housekeeping._thread_pid = threading.current_thread(), os.getpid()
        for i in range(20):
            housekeeping.make_job_folder(root / f"job{{i}}")
            (root / f"job{{i}}" / "logs" / "a.log").write_text("x")
        for i in range(20):
            remove_folder(root / f"job{{i}}")
        assert [k for k, _ in housekeeping._todo].count("remove") == 20
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert sorted(n for n in os.listdir(tmp_path) if not n.startswith(".spare")) == []


def test_a_process_that_ends_while_its_purged_folder_is_made_a_spare_leaves_no_half_made_one(tmp_path):
    # The thread renames a purged folder under .spare/.building-* and empties it; a process
    # that ended meanwhile left it there whole (its results too) for the sweep an hour on.
    # At exit, the thread's work in hand is finished first.
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from elsewhere.folder import housekeeping
        from elsewhere.folder.lifecycle import remove_folder
        root = Path({str(tmp_path)!r})
        job = root / "job"
        housekeeping.make_job_folder(job)
        deadline = time.monotonic() + 30
        while not housekeeping._ready(root / housekeeping.SPARES):
            assert time.monotonic() < deadline
            time.sleep(0.01)  # the next spare is made: a purge now makes the second
        (job / "results" / "w.bin").write_bytes(b"x" * 100_000)
        empty = housekeeping._empty
        def slow_empty(folder):  # a folder of many files: emptying it takes a while
            time.sleep(0.5)
            return empty(folder)
        housekeeping._empty = slow_empty
        remove_folder(job)
        while not housekeeping._doing:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        time.sleep(0.05)  # in slow_empty now; the process ends
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    left = os.listdir(tmp_path / housekeeping.SPARES)
    assert [n for n in left if n.startswith(".building-")] == [], left
    assert len(spares(tmp_path)) == 2  # the purged folder is the second spare
    assert sorted(n for n in os.listdir(tmp_path) if n != housekeeping.SPARES) == []


def ended_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)
    return proc.pid


def test_leftovers_of_killed_processes_are_swept(tmp_path, monkeypatch):
    host = os.uname().nodename
    dead = tmp_path / f".20260101-000000-abcd.purged-{ended_pid()}-2-{host}"
    older = tmp_path / f".20260101-000000-abce.purged-{ended_pid()}-2"  # named by an earlier version
    # a process that runs may be making its grave a spare; another machine's may still run
    alive = tmp_path / f".20260101-000000-abcf.purged-{os.getpid()}-2-{host}"
    elsewhere = tmp_path / f".20260101-000000-abd0.purged-{ended_pid()}-2-{host}-not-this-one"
    for grave in (dead, older, alive, elsewhere):
        (grave / "logs").mkdir(parents=True)
    # a purged folder being made a spare: renamed there just now, its mtime its job's
    building = tmp_path / housekeeping.SPARES / ".building-1-abcd"
    building.mkdir(parents=True)
    os.utime(building, (time.time() - 7200, time.time() - 7200))
    housekeeping.make_job_folder(tmp_path / "job")
    wait_for(lambda: not dead.exists() and not older.exists())
    assert alive.is_dir() and elsewhere.is_dir() and building.is_dir()
    monkeypatch.setattr(housekeeping, "_OLD_S", -1.0)  # an hour on, they are taken for left behind
    housekeeping._sweep(tmp_path)
    assert not alive.exists() and not elsewhere.exists() and not building.exists()


def test_a_purged_job_folder_is_made_the_next_spare(tmp_path):
    # Emptied and its files made new (but three): a third of the cost to the disk of a removal
    # and a build.
    job = tmp_path / "job"
    housekeeping.make_job_folder(job)
    wait_for(lambda: len(spares(tmp_path)) == 1)
    (job / "job.json").write_text('{"n_tasks": 2}')
    for sub, name in (("journal", "w1.rec"), ("results", "w1.bin"), ("logs", "w1.log"), ("workers", "w1.cur")):
        (job / sub / name).write_bytes(b"x" * 100)
    (job / "files" / "deep").mkdir(parents=True)
    (job / "files" / "deep" / "data.txt").write_text("attached")
    (job / "damage.txt").write_text("damaged: journal/w1.rec")
    inode = job.stat().st_ino
    kept = {n: (job / n).stat().st_ino for n in os.listdir(job)}
    held = os.open(job / "queue.json", os.O_WRONLY)  # a process of the purged job still holds it
    try:
        remove_folder(job)
        wait_for(lambda: len(spares(tmp_path)) == 2)
        os.write(held, b"stale")
    finally:
        os.close(held)
    made = [tmp_path / housekeeping.SPARES / n for n in spares(tmp_path)]
    spare = next(p for p in made if p.stat().st_ino == inode)
    fresh = next(p for p in made if p != spare)
    assert complete(spare) and stat.S_IMODE(spare.stat().st_mode) == 0o700
    assert sorted(os.listdir(spare)) == sorted(os.listdir(fresh))  # nothing of the job's is left
    assert all(os.listdir(spare / sub) == [] for sub in housekeeping.SUBDIRS)
    assert all((spare / f).stat().st_size == 0 for f in housekeeping.FILES)  # the stale write went elsewhere
    # its lock, FIFO and job.json (emptied) are kept: fewer files made and removed per job
    assert {n for n in housekeeping.FILES + (housekeeping.NOTIFY,) if (spare / n).stat().st_ino == kept[n]} == set(housekeeping.KEPT)
    assert not [n for n in os.listdir(tmp_path) if ".purged-" in n]
    # With SPARES_KEPT spares made, the next purged folder is removed
    assert housekeeping.SPARES_KEPT == 2
    other = tmp_path / "other"
    housekeeping._build(other)  # (not a spare taken: two are left)
    remove_folder(other)
    wait_for(lambda: not [n for n in os.listdir(tmp_path) if ".purged-" in n])
    assert len(spares(tmp_path)) == housekeeping.SPARES_KEPT


def _a_job_and_a_spare(tmp_path):
    """(the storage, a job folder made in it), once the next spare is made."""
    root = tmp_path / "jobs"
    root.mkdir()
    job = root / "job"
    housekeeping.make_job_folder(job)
    wait_for(lambda: len(spares(root)) == 1)
    return root, job


def test_a_purged_folder_its_tasks_changed_is_removed_and_no_link_in_it_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("the user's")
    root, job = _a_job_and_a_spare(tmp_path)
    os.rmdir(job / "logs")
    os.symlink(outside, job / "logs")  # a subfolder made a link by a task
    remove_folder(job)
    wait_for(lambda: not [n for n in os.listdir(root) if ".purged-" in n])
    assert (outside / "keep.txt").read_text() == "the user's"
    assert len(spares(root)) == 1  # removed, not made a spare


def test_a_kept_file_a_task_replaced_by_a_link_is_made_new_and_the_link_not_followed(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's")
    root, job = _a_job_and_a_spare(tmp_path)
    os.unlink(job / "job.json")
    os.symlink(outside, job / "job.json")  # made a link to a file of the user's by a task
    remove_folder(job)
    wait_for(lambda: len(spares(root)) == 2)
    assert outside.read_text() == "the user's"  # not emptied through the link
    for name in spares(root):
        st = os.lstat(root / housekeeping.SPARES / name / "job.json")
        assert stat.S_ISREG(st.st_mode) and st.st_size == 0


def test_syncs_left_at_exit_are_done(tmp_path):
    log = tmp_path / "synced.log"
    script = textwrap.dedent(f"""
        import os, threading
        from pathlib import Path
        from elsewhere.folder import housekeeping
        root = Path({str(tmp_path)!r})
        real = housekeeping._sync
        def sync(spec):
            real(spec)  # a job purged meanwhile ("gone") must not fail it
            with open({str(log)!r}, "a") as f:
                f.write(str(spec).replace("\\0", "+") + "\\n")
        housekeeping._sync = sync
        # as if the background thread were busy elsewhere: the syncs must happen at exit
        housekeeping._thread, housekeeping._thread_pid = threading.current_thread(), os.getpid()
        (root / "job.json").write_text("{{}}")
        housekeeping.sync_later(root, ("job.json", "payload.log"))
        housekeeping.sync_later(root / "gone", ("job.json",))
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert log.read_text().splitlines() == [f"{tmp_path}/job.json+payload.log", f"{tmp_path}/gone/job.json"]


def test_background_work_waits_while_the_client_is_busy(tmp_path):
    # Submitting and reading results are hot: removals (and syncs, spares) wait until
    # the client waits on its workers, or at most a second, then happen.
    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / "f").write_bytes(b"x")
    with housekeeping.hot():
        housekeeping.remove_later(gone)
        time.sleep(0.3)
        assert gone.exists(), "removed while the client was busy"
    wait_for(lambda: not gone.exists(), 10)

    # ... but never longer than _DEFER_MAX_S
    late = tmp_path / "late"
    late.mkdir()
    with housekeeping.hot():
        housekeeping.remove_later(late)
        wait_for(lambda: not late.exists(), 10)


def test_work_done_at_exit_while_the_thread_waits_out_a_busy_client_does_not_kill_it(tmp_path):
    # A process that ends right after a submission: finish() (at exit) takes the work
    # while the thread waits for the client to be done; the thread must not trip on the
    # emptied list (it printed a traceback as the process ended) and must go on serving.
    import threading

    died: list[BaseException | None] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: died.append(args.exc_value)
    try:
        first = tmp_path / "first"
        first.mkdir()
        with housekeeping.hot():
            housekeeping.remove_later(first)
            time.sleep(0.2)  # the thread is waiting for the hot section to end
            housekeeping.finish()
            assert not first.exists()
            time.sleep(0.2)
        later = tmp_path / "later"
        later.mkdir()
        housekeeping.remove_later(later)
        wait_for(lambda: not later.exists(), 10)
    finally:
        threading.excepthook = old_hook
    assert died == []
    assert housekeeping._thread is not None and housekeeping._thread.is_alive()


def test_a_sync_waits_its_delay_and_a_folder_gone_by_then_costs_no_fsync(tmp_path, monkeypatch):
    # A submitted job's inputs are made durable SYNC_DELAY_S later: a short job purged
    # before then (an ew.map of tiny tasks) costs the disk nothing.
    synced: list[tuple[float, str]] = []
    fsyncs: list[int] = []
    real_sync, real_fsync = housekeeping._sync, os.fsync
    monkeypatch.setattr(housekeeping, "SYNC_DELAY_S", 0.5)
    # (recorded once the sync is done, so that waiting for two records waits for their fsyncs)
    monkeypatch.setattr(housekeeping, "_sync", lambda spec: (t := time.monotonic(), real_sync(spec),
                                                              synced.append((t, spec.parent.name))))
    monkeypatch.setattr(housekeeping.os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd)))
    kept, purged = tmp_path / "kept", tmp_path / "purged"
    for d in (kept, purged):
        d.mkdir()
        (d / "job.json").write_text("{}")
    t0 = time.monotonic()
    housekeeping.sync_later(purged, ("job.json",))
    remove_folder(purged)  # purged at once: renamed away, removed in the background
    housekeeping.sync_later(kept, ("job.json",))
    wait_for(lambda: len(synced) == 1, 10)
    time.sleep(0.2)
    assert [name for _, name in synced] == ["kept"]  # the purge dropped the other's sync
    assert synced[0][0] - t0 >= 0.5  # (a lower bound the code keeps: not a measure of speed)
    assert len(fsyncs) == 2  # kept's job.json and its folder; nothing of the purged job


def test_a_file_written_in_place_holds_its_object_alone_over_an_empty_or_a_longer_one(tmp_path):
    # write_new writes into a spare's empty file without cutting it to nothing first (ext4
    # writes a file cut to nothing and written again back at its close): it cuts it to the
    # written length after, so that nothing of a longer file before is left behind it
    from elsewhere.folder.store import read_sealed, write_new

    empty = tmp_path / "job.json"
    empty.touch()
    write_new(empty, {"a": 1}, sealed=True)
    assert read_sealed(empty, "job.json") == {"a": 1}
    longer = tmp_path / "info.json"
    longer.write_bytes(b'{"an old object": "much longer than the new one", "and": [1, 2, 3]}')
    write_new(longer, {"b": 2})
    assert longer.read_bytes() == b'{"b":2}'
