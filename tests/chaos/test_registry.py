"""The registry under abuse: a damaged or deleted file, processes racing to make it, a full
disk, purges while another process lists the jobs.

The job folders are the truth and the registry only finds them, so whatever happens to the
registry no job may be lost from ``elsewhere jobs`` or ``ew.recover``, no command may print a
traceback, and no row may be left pointing at a folder that is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import elsewhere as ew
from chaos.conftest import Tally, run_cli, scaled
from elsewhere.backends.local import LocalCluster
from elsewhere.folder.registry import Registry

SUBMIT = textwrap.dedent("""
    import sys
    import elsewhere as ew
    for name in sys.argv[1:]:
        job = ew.submit(abs, [-1, -2, -3], on=ew.local(), name=name)
        job.wait(timeout=60)
        assert job.results() == [1, 2, 3]
""")


def submit_elsewhere(tmp_path: Path, home: Path, *names: str) -> None:
    """Submit jobs from another process, which ends: its registry connection is closed (the
    WAL written back into the file), as after any user's session."""
    script = tmp_path / "submit.py"
    script.write_text(SUBMIT)
    p = subprocess.run([sys.executable, str(script), *names], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "ELSEWHERE_HOME": str(home)})  # fmt: skip
    assert p.returncode == 0, p.stderr


def listed(tally: Tally, home: Path) -> dict[str, str]:
    """``elsewhere jobs --json`` in a new process: {name: state}."""
    p = run_cli(tally, "jobs", "--json", env={"ELSEWHERE_HOME": str(home)})
    assert p.returncode == 0, p.stderr
    return {r["name"]: r["state"] for r in json.loads(p.stdout)}


def recover_elsewhere(tally: Tally, name: str) -> subprocess.CompletedProcess[str]:
    """``print(ew.recover(name).results())`` in a new process (this one keeps no connection
    to the registry open, which would hide what a new session meets)."""
    p = subprocess.run([sys.executable, "-c", f"import elsewhere as ew; print(ew.recover({name!r}).results())"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    tally.check_output(f"ew.recover({name!r})", p.stderr)
    return p


def rows(home: Path) -> list[tuple[str, str]]:
    """(name, path) of every row of the registry file, read as it is."""
    con = sqlite3.connect(home / "registry.sqlite")
    try:
        return con.execute("SELECT name, path FROM jobs").fetchall()
    finally:
        con.close()


def _garbage(b: bytes) -> bytes:
    return os.urandom(max(len(b), 4096))


def _header_kept(b: bytes) -> bytes:
    return b[:100] + os.urandom(max(len(b), 8192) - 100)


def _pages_flipped(b: bytes) -> bytes:
    return b[:4096] + bytes(x ^ 0xFF for x in b[4096:])


DAMAGE = {
    "random bytes": _garbage,
    "zeros": lambda b: bytes(max(len(b), 4096)),
    "text": lambda b: b"this is not a database\n" * 200,
    "header kept, pages random": _header_kept,
    "pages flipped": _pages_flipped,
    "cut to 50 bytes": lambda b: b[:50],
    "empty": lambda b: b"",
    "deleted": None,
}


@pytest.mark.timeout(180)
def test_a_damaged_registry_is_rebuilt_from_the_job_folders(
    ew_home: Path, tmp_path: Path, tally: Tally
) -> None:
    names = ["alpha", "beta", "gamma"]
    submit_elsewhere(tmp_path, ew_home, *names)
    reg = ew_home / "registry.sqlite"
    for round_ in range(scaled(1)):
        for i, (kind, damage) in enumerate(DAMAGE.items()):
            tally.trial()
            if damage is None:
                for suffix in ("", "-wal", "-shm"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{reg}{suffix}")
            else:
                reg.write_bytes(damage(reg.read_bytes()))
            damaged = (
                0 if kind in ("deleted", "empty") else 1
            )  # warnings: one, from the first to meet it
            if i % 2:  # the command line meets the damage first, or ew.recover
                p = run_cli(tally, "jobs", "--json")
                assert p.returncode == 0, f"{kind}: {p.stderr}"
                got = {r["name"]: r["state"] for r in json.loads(p.stdout)}
                assert p.stderr.count("was damaged") == damaged, f"{kind}: {p.stderr}"
                p = recover_elsewhere(tally, "gamma")
                assert p.stdout.strip() == "[1, 2, 3]" and "damaged" not in p.stderr, (
                    f"{kind}: {p.stderr}"
                )
            else:
                p = recover_elsewhere(tally, "beta")
                assert p.stdout.strip() == "[1, 2, 3]", f"{kind}: {p.stderr}"
                assert p.stderr.count("was damaged") == damaged, f"{kind}: {p.stderr}"
                p = run_cli(tally, "jobs", "--json")
                assert p.returncode == 0 and "damaged" not in p.stderr, f"{kind}: {p.stderr}"
                got = {r["name"]: r["state"] for r in json.loads(p.stdout)}
            if set(got) != set(names):
                tally.lose(len(set(names) - set(got)), f"{kind} (round {round_}): listed {got}")
            assert all(s == "finished" for s in got.values()), f"{kind}: {got}"
    aside = list(ew_home.glob("registry.sqlite.damaged-*"))
    assert aside, "the damaged files were not kept"


RACER = textwrap.dedent("""
    import json, sys
    import elsewhere as ew
    import elsewhere.core.submit, elsewhere.folder.registry, sqlite3  # imported before the start
    on = ew.local()
    print("ready", flush=True)
    sys.stdin.readline()  # all start together
    job = ew.submit(abs, [-1, -2], on=on, name=sys.argv[1])
    job.wait(timeout=60)
    print(json.dumps(job.results()))
""")


@pytest.mark.timeout(240)
def test_processes_making_their_first_submit_at_once_in_a_new_home_all_succeed(
    ew_home: Path, tmp_path: Path, tally: Tally, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    for round_ in range(scaled(2)):
        home = ew_home / f"round-{round_}"  # new: no folder, no registry yet
        env = {**os.environ, "ELSEWHERE_HOME": str(home)}
        names = [f"racer-{round_}-{i}" for i in range(8)]
        procs = [subprocess.Popen([sys.executable, str(script), n], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for n in names]  # fmt: skip
        try:
            for p in procs:
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            for n, p in zip(names, procs):
                tally.trial()
                try:
                    out, err = p.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    tally.hang(f"{n} did not end")
                    continue
                tally.check_output(n, err)
                if p.returncode != 0 or out.strip().splitlines()[-1:] != ["[1, 2]"]:
                    tally.lose(2, f"{n}: exit {p.returncode}: {err.strip()[-300:]}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            with monkeypatch.context() as m:  # this home's idle workers go now, not at the end
                m.setenv("ELSEWHERE_HOME", str(home))
                LocalCluster().shutdown()
        registered = sorted(name for name, _ in rows(home))
        if registered != names:
            tally.lose(
                len(set(names) - set(registered)), f"round {round_}: registered {registered}"
            )


OPENER = textwrap.dedent("""
    import os, sys, time, traceback
    from pathlib import Path
    from elsewhere.folder.registry import Registry
    print("ready", flush=True)
    for line in sys.stdin:  # one new registry per line, made by every process at once
        folder, start = line.split()
        home = Path(folder)
        time.sleep(max(0.0, float(start) - time.time()))  # all wake together (a line wakes one after another)
        meta = {"id": f"{os.getpid()}-{home.name}", "name": f"opener-{os.getpid()}", "cluster": {}}
        try:
            Registry(home / "registry.sqlite").add(meta, home / "jobs" / meta["id"], lambda row: None)
            print("ok", flush=True)
        except Exception:
            print("error: " + traceback.format_exc().strip().splitlines()[-1], flush=True)
""")


@pytest.mark.timeout(120)
def test_processes_opening_a_new_registry_at_once_all_register(
    tmp_path: Path, tally: Tally
) -> None:
    """The same race as above, narrowed to the registry, many times over: eight processes
    that each make a registry, again and again, at the same moment (without the lock, about
    one open in thirty met "database is locked")."""
    with _crowd(tmp_path, OPENER, 8) as procs:
        for round_ in range(scaled(50)):
            home = tmp_path / f"home-{round_}"
            _ask_all(tally, round_, procs, [f"{home} {time.time() + 0.05}"] * len(procs))
            if len(rows(home)) != len(procs):
                tally.lose(
                    len(procs) - len(rows(home)), f"round {round_}: {len(rows(home))} registered"
                )


@contextlib.contextmanager
def _crowd(tmp_path: Path, code: str, n: int) -> Iterator[list[subprocess.Popen[str]]]:
    """``n`` processes running ``code``, each ready (it said so)."""
    script = tmp_path / "crowd.py"
    script.write_text(code)
    procs = [subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(n)]  # fmt: skip
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


def _ask_all(tally: Tally, round_: int, procs: list[subprocess.Popen[str]], lines: list[str]) -> None:
    """One line to each process (a moment to start at in it: a line wakes one after
    another); each answer that is not "ok" counts as lost."""
    for p, line in zip(procs, lines):
        assert p.stdin is not None
        p.stdin.write(line + "\n")
        p.stdin.flush()
    answers = [p.stdout.readline().strip() for p in procs if p.stdout is not None]
    tally.trial(len(procs))
    for a in answers:
        if a != "ok":
            tally.lose(1, f"round {round_}: {a or 'no answer (the process died)'}")


MEETER = textwrap.dedent("""
    import logging, os, random, sys, threading, time, traceback
    from pathlib import Path
    from elsewhere.folder.registry import Registry
    logging.disable(logging.WARNING)  # the warning of the one that rebuilds it
    print("ready", flush=True)

    def meet(reg, kind, i, out):
        # calls for 30 ms from a moment spread over the time a rebuild takes, some meeting the
        # garbage, some the new file (this thread opens the file again for each call)
        end = time.time() + random.uniform(0, 0.02) + 0.03
        try:
            if kind == "add":
                meta = {"id": f"{os.getpid()}-{i}", "name": f"meeter-{os.getpid()}", "cluster": {}}
                reg.add(meta, reg.path.parent / "jobs" / meta["id"], lambda row: None)
            while time.time() < end:
                reg.find("nothing") if kind == "find" else reg.all()
            out.append("ok")
        except Exception:
            out.append("error: " + traceback.format_exc().strip().splitlines()[-1])

    for i, line in enumerate(sys.stdin):  # one damaged registry per line, met by every process at once
        folder, start, kind = line.split()
        time.sleep(max(0.0, float(start) - time.time()))
        out = []
        t = threading.Thread(target=meet, args=(Registry(Path(folder) / "registry.sqlite"), kind, i, out))
        t.start()
        t.join()
        print(out[0], flush=True)
""")



@pytest.mark.timeout(180)
def test_processes_meeting_a_damaged_registry_at_once_all_go_on(tmp_path: Path, tally: Tally) -> None:
    """Eight processes meet a registry overwritten with garbage at the same moment: one
    rebuilds it, and every one reads or registers, none losing what another registered.
    (While the new file was made in place, others could open it half made, and take it for
    damaged in turn, moving it aside under those that had registered in it, or fail with
    "disk I/O error".)"""
    kinds = ["add", "find", "all", "add", "find", "all", "add", "all"]
    with _crowd(tmp_path, MEETER, len(kinds)) as procs:
        for round_ in range(scaled(150)):  # (about one round in a hundred failed before)
            home = tmp_path / f"home-{round_}"
            home.mkdir()
            (home / "registry.sqlite").write_bytes(b"this is not an SQLite database" * 100)
            start = time.time() + 0.05
            _ask_all(tally, round_, procs, [f"{home} {start} {kind}" for kind in kinds])
            added = kinds.count("add")
            if len(rows(home)) != added:
                tally.lose(added - len(rows(home)), f"round {round_}: {len(rows(home))} of {added} registered")


SLOW_NAMER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from elsewhere.folder.registry import Registry
    reg_path, asking, done = map(Path, sys.argv[1:4])

    def slow_state(row):  # a cluster's poll that takes its time: until another process has written
        asking.touch()
        deadline = time.time() + 30
        while not done.exists() and time.time() < deadline:
            time.sleep(0.01)
        return "finished"

    meta = {"id": "second", "name": "same", "cluster": {}}
    Registry(reg_path).add(meta, reg_path.parent / "jobs" / "second", slow_state)
    print("registered after the other's write" if done.exists() else "registered when its wait ran out")
""")


@pytest.mark.timeout(120)
def test_a_slow_look_at_a_job_of_the_same_name_holds_no_other_process_up(tmp_path: Path) -> None:
    """Registering a job whose name an older job has asks that job's state, which for a batch
    or ssh job asks its cluster: seconds, perhaps. It was asked inside the registry's write
    transaction, every other process's registry write waiting for it (up to SQLite's 60 s,
    then failing). Here the look waits until another process has written to the registry."""
    reg_path = tmp_path / "registry.sqlite"
    reg = Registry(reg_path)
    reg.add({"id": "first", "name": "same", "cluster": {}}, tmp_path / "jobs" / "first", lambda row: None)
    asking, done = tmp_path / "asking", tmp_path / "done"
    script = tmp_path / "namer.py"
    script.write_text(SLOW_NAMER)
    namer = subprocess.Popen([sys.executable, str(script), str(reg_path), str(asking), str(done)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not asking.exists():
            assert namer.poll() is None, namer.communicate()
            assert time.monotonic() < deadline, "the second registration never asked the first job's state"
            time.sleep(0.01)
        writer = subprocess.run(
            [sys.executable, "-c", "import sys; from pathlib import Path; from elsewhere.folder.registry import "
             "Registry; Registry(Path(sys.argv[1])).set_state('first', 'finished'); Path(sys.argv[2]).touch()",
             str(reg_path), str(done)], capture_output=True, text=True, timeout=20)  # fmt: skip
        assert writer.returncode == 0, writer.stderr
        out, err = namer.communicate(timeout=60)
    finally:
        if namer.poll() is None:
            namer.kill()
            namer.communicate()
    assert namer.returncode == 0, err
    assert out.strip() == "registered after the other's write", out
    assert {r["id"]: r["state"] for r in reg.all()} == {"first": "finished", "second": "queued"}


READER = textwrap.dedent("""
    import sqlite3, sys
    con = sqlite3.connect(sys.argv[1], isolation_level=None)
    con.execute("BEGIN")  # a read that lasts: its lock held until it ends
    con.execute("SELECT count(*) FROM jobs").fetchone()
    print("reading", flush=True)
    sys.stdin.readline()
""")


@pytest.mark.timeout(120)
def test_an_older_registry_another_process_reads_is_made_anew_without_waiting(
    ew_home: Path, tmp_path: Path, tally: Tally
) -> None:
    """A registry without a version (as older versions made it, or one read while it was
    cut to nothing) is made again whole, and renamed over the old one, at once. It was
    switched to WAL in place, which waits for every reader, all processes waiting behind
    registry.lock meanwhile: for a minute (CI met it when the chaos test above cut the file
    while its own process's housekeeping read it)."""
    submit_elsewhere(tmp_path, ew_home, "alpha", "beta")
    reg = ew_home / "registry.sqlite"
    con = sqlite3.connect(reg, isolation_level=None)  # the file as an older version left it
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("PRAGMA user_version = 0")
    con.close()
    script = tmp_path / "reader.py"
    script.write_text(READER)
    reader = subprocess.Popen([sys.executable, str(script), str(reg)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "reading"
        tally.trial()
        p = run_cli(tally, "jobs", "--json", timeout=30)
        assert p.returncode == 0, p.stderr
        assert {r["name"]: r["state"] for r in json.loads(p.stdout)} == {"alpha": "finished", "beta": "finished"}
        assert "damaged" not in p.stderr, p.stderr
    finally:
        reader.kill()
        reader.communicate()
    assert sqlite3.connect(reg).execute("PRAGMA user_version").fetchone()[0] == 1
    assert not list(ew_home.glob("registry.sqlite.new-*")), "the file made was left beside"


LISTER = textwrap.dedent("""
    import json, os, sys, traceback
    import elsewhere as ew
    stop, count = sys.argv[1], sys.argv[2]
    bad, n = [], 0
    while not os.path.exists(stop):
        try:
            for e in ew.jobs():
                if str(e["state"]).startswith("unreadable") or e["state"] == "missing":
                    bad.append(f"{e['name']}: {e['state']}")
        except Exception:
            bad.append(traceback.format_exc())
        n += 1
        with open(count + ".tmp", "w") as f:
            f.write(str(n))
        os.replace(count + ".tmp", count)
    print(json.dumps({"listings": n, "bad": bad}))
""")


def _count(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


@pytest.mark.timeout(180)
def test_jobs_purged_while_another_process_lists_them_leave_no_row(ew_home: Path, tmp_path: Path,
                                                                   tally: Tally) -> None:  # fmt: skip
    n = scaled(8)
    jobs = [ew.submit(abs, [-i], on=ew.local(), name=f"purged-{i}") for i in range(n)]
    for job in jobs:
        job.wait(timeout=60)
    script, stop, count = tmp_path / "lister.py", tmp_path / "stop", tmp_path / "count"
    script.write_text(LISTER)
    lister = subprocess.Popen([sys.executable, str(script), str(stop), str(count)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        for i, job in enumerate(jobs):
            seen = _count(count)
            deadline = time.monotonic() + 30
            while _count(count) <= seen and lister.poll() is None:  # a listing runs as the job goes
                if time.monotonic() > deadline:
                    tally.hang("the lister made no progress in 30 s")
                    break
                time.sleep(0.005)
            if i % 2:
                p = run_cli(tally, "purge", job.name)
                assert p.returncode == 0, p.stderr
            else:
                job.purge()
            tally.trial()
        stop.touch()
        out, err = lister.communicate(timeout=60)
    finally:
        stop.touch()
        if lister.poll() is None:
            lister.kill()
    tally.check_output("the lister", err)
    report = json.loads(out.strip().splitlines()[-1])
    assert not report["bad"], report["bad"][:5]
    assert report["listings"] >= 1
    assert rows(ew_home) == [], "rows left pointing at purged jobs"
    assert listed(tally, ew_home) == {}


def _mount_tmpfs(path: Path, size: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a small tmpfs, which only root can mount")
    path.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                       capture_output=True, text=True)  # fmt: skip
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")


def _fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte; return the filler file."""
    filler = folder / "filler"
    block = b"\0" * (64 << 10)
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                f.write(block)
            except OSError:
                block = block[: len(block) // 2]
                if not block:
                    return filler


@pytest.mark.timeout(180)
def test_on_a_full_disk_jobs_are_listed_recovered_and_purged(
    ew_home: Path, tmp_path: Path, tally: Tally
) -> None:
    _mount_tmpfs(ew_home, "4m")
    try:
        submit_elsewhere(tmp_path, ew_home, "alpha", "beta", "gamma")
        run_cli(tally, "workers", "stop")
        filler = _fill(ew_home)
        for _ in range(scaled(2)):
            tally.trial()
            got = listed(tally, ew_home)
            assert got == {"alpha": "finished", "beta": "finished", "gamma": "finished"}, got
            p = recover_elsewhere(tally, "beta")
            assert p.stdout.strip() == "[1, 2, 3]", p.stderr
        tally.trial()
        p = run_cli(tally, "purge", "alpha")  # the way to free space: it must work
        assert p.returncode == 0, p.stderr
        assert listed(tally, ew_home) == {"beta": "finished", "gamma": "finished"}
        filler.unlink()
        assert listed(tally, ew_home) == {"beta": "finished", "gamma": "finished"}
        assert sorted(name for name, _ in rows(ew_home)) == [
            "beta",
            "gamma",
        ]  # the row went with space
    finally:
        subprocess.run(["umount", "-l", str(ew_home)], capture_output=True)
