"""A job folder damaged on disk: never a wrong value, never a hang, and the damage said.

Real jobs run on local workers; then one file of their folder is damaged the way a disk, a
careless user or a crash would: a bit flipped, the file cut at a random point, garbage
inserted, the file deleted or replaced. Each trial damages its own copy of a finished job
(the folder copied and registered under a new name) or, for the payload, a job whose workers
wait at a gate while its payload is damaged under them. Every trial checks that every value
read is the right one or a TaskError that names the damaged file and the task, that the tasks
whose data were not touched keep their values, that ``wait()`` ends, and that ``job.check()``
(and, for some trials, ``elsewhere status NAME``) says what is damaged.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import elsewhere as ew
from chaos.conftest import Tally, run_cli, scaled
from elsewhere.folder import records
from elsewhere.folder.journal import JournalReader
from elsewhere.folder.registry import Registry
from elsewhere.folder.store import JobStore
from elsewhere.util.errors import DamagedJob

pytestmark = pytest.mark.timeout(300)

N = 48  # tasks of a base job


def work(i: int):
    """A task of a base job: errors (error records), arrays out of band, small values."""
    if i % 7 == 3:
        raise ValueError(f"no {i}")
    if i % 3 == 0:
        return np.full(9000, float(i))  # 72 kB: an out-of-band buffer in the results file
    return i * i


def expected(i: int):
    if i % 7 == 3:
        return ("error", f"no {i}")
    if i % 3 == 0:
        return np.full(9000, float(i))
    return i * i


def same(value, want) -> bool:
    if isinstance(want, tuple):
        return (isinstance(value, ew.TaskError) and value.reason == "error" and value.type_name == "ValueError"
                and value.message == want[1])  # fmt: skip
    if isinstance(want, np.ndarray):
        return (
            isinstance(value, np.ndarray)
            and value.dtype == want.dtype
            and np.array_equal(value, want)
        )
    return type(value) is type(want) and value == want


def run_base(name: str) -> ew.Job:
    job = ew.submit(work, range(N), on=ew.local(cores=2), name=name)
    job.wait(timeout=120)
    assert job.check().state is ew.JobState.FAILED  # its errors: the tasks i % 7 == 3
    return job


def clone(job: ew.Job, name: str) -> Path:
    """A copy of a finished job's folder, registered as job ``name``: one trial's own job."""
    new_id = f"{job.id}-{name}"
    dst = job.path.with_name(new_id)
    shutil.copytree(job.path, dst, ignore=shutil.ignore_patterns("notify.fifo"))
    os.mkfifo(dst / "notify.fifo", 0o600)
    meta = JobStore(dst).update_meta(id=new_id, name=name)
    Registry().add(meta, dst, lambda row: None)
    return dst


def bodies(path: Path) -> dict[tuple[str, int], tuple[int, set[int]]]:
    """{(worker, offset): (length, its tasks)} of the result bodies of a (pristine) job folder."""
    reader = JournalReader(JobStore(path))
    reader.refresh()
    out: dict[tuple[str, int], tuple[int, set[int]]] = {}
    for (wid, rec), tasks in reader.final.by_entry().items():
        entry = out.setdefault((wid, rec.res_off), (rec.res_len, set()))
        entry[1].update(tasks)
    return out


def frames(data: bytes) -> list[tuple[int, int, set[int]]]:
    """(start, end, tasks) of each frame of a (pristine) journal."""
    out, pos = [], 0
    while pos < len(data):
        count = int.from_bytes(data[pos + 4 : pos + 8], "little")
        end = pos + 24 + 80 * count
        recs, _, _ = records.scan_frames(data[pos:end])
        out.append((pos, end, {t for r in recs for t in range(r.task, r.task + r.count)}))
        pos = end
    return out


def damage(rng: random.Random, path: Path, how: str, pos: int | None = None) -> int:
    """Damage file ``path`` ``how``; returns the offset it happened at (-1: whole file)."""
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
        return -1
    if how == "random":
        path.write_bytes(rng.randbytes(max(1, len(data))))
        return -1
    if pos is None:
        pos = rng.randrange(len(data))
    if how == "flip":
        b = bytearray(data)
        b[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(b)
    elif how == "cut":
        path.write_bytes(data[:pos])
    elif how == "garbage":
        path.write_bytes(data[:pos] + rng.randbytes(rng.randrange(1, 200)) + data[pos:])
    return pos


class Checker:
    """Reads a damaged job as a user would and counts what went wrong."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.problems: list[str] = []

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def job(self, name: str, *, may_fail: set[int], must_fail: set[int], files: tuple[str, ...],
            cli: bool, damaged: bool = True, poll_s: float = 0.5) -> ew.Job | None:  # fmt: skip
        """Recover job ``name``; wait (with a timeout); check every value; check the status."""
        tally = self.tally
        job = ew.recover(name)
        try:
            job.wait(timeout=30, poll_interval_s=poll_s)
        except ew.TimeoutError as exc:
            tally.hang(f"{name}: {exc}")
            return None
        values = job.results()
        failed = set()
        for i, v in enumerate(values):
            if isinstance(v, ew.TaskError) and v.reason == "damaged":
                failed.add(i)
                text = str(v)
                if i not in may_fail:
                    tally.lose(1, f"{name}: task {i}, whose data were intact, failed: {text}")
                elif not any(f"damaged: {f}" in text for f in files) or f"task {i}" not in text:
                    self.problem(
                        f"{name}: the error of task {i} does not name the file {files}: {text}"
                    )
            elif not same(v, expected(i)):
                tally.lose(1, f"{name}: task {i} gave a wrong value {v!r:.80}")
        if must_fail - failed:
            self.problem(f"{name}: damage to tasks {sorted(must_fail - failed)} went unseen")
        status = job.check()
        if damaged and "damaged" not in status.note:
            self.problem(f"{name}: check() does not say what is damaged: {status}")
        if failed and status.counts["failed"] < len(failed):
            self.problem(f"{name}: {len(failed)} damaged tasks, but check() says {status}")
        if cli:
            p = run_cli(tally, "status", name)
            if damaged and "damaged" not in p.stdout:
                self.problem(
                    f"{name}: `elsewhere status` does not say what is damaged: {p.stdout}{p.stderr}"
                )
        return job

    def verify(self) -> None:
        assert not self.problems, "\n".join(self.problems[:20])


def test_damaged_results_cost_only_their_own_tasks(ew_home, tally):
    rng = random.Random(23)
    base = run_base("base-results")
    layout = bodies(base.path)
    by_worker: dict[str, list[tuple[int, int, set[int]]]] = {}
    for (wid, off), (length, tasks) in layout.items():
        by_worker.setdefault(wid, []).append((off, off + length, tasks))
    check = Checker(tally)
    hows = ["flip", "flip", "flip", "cut", "garbage", "delete"]
    retried = 0
    for k in range(scaled(60)):
        tally.trial()
        name = f"res{k}"
        path = clone(base, name)
        wid = rng.choice(sorted(by_worker))
        spans = by_worker[wid]
        how = hows[k % len(hows)]
        pos = None
        aim = k % 3  # anywhere; inside an array's bytes (out of band); inside a body with errors
        if how == "flip" and aim:
            raw = (path / "results" / f"{wid}.bin").read_bytes()
            pick = [
                s
                for s in spans
                if (aim == 1 and _buffers(raw, s[0]))
                or (aim == 2 and any(t % 7 == 3 for t in s[2]))
            ]
            if pick:
                a, b, _ = rng.choice(pick)
                lo = b - _buffers(raw, a) if aim == 1 else a
                pos = rng.randrange(lo, b)
        at = damage(rng, path / "results" / f"{wid}.bin", how, pos)
        if how == "delete":
            hit = {t for _, _, ts in spans for t in ts}
        elif how == "flip":
            hit = {t for a, b, ts in spans if a <= at < b for t in ts}
        else:  # cut or garbage at ``at``: every body that ends after it
            hit = {t for a, b, ts in spans if b > at for t in ts}
        job = check.job(
            name, may_fail=hit, must_fail=hit, files=(f"results/{wid}.bin",), cli=k % 6 == 0
        )
        if job is not None and retried < 3 and hit:
            retried += 1
            job.retry()
            job.wait(timeout=60)
            values = job.results()
            wrong = [i for i, v in enumerate(values) if not same(v, expected(i))]
            tally.lose(len(wrong), f"{name}: after retry(), tasks {wrong} are wrong")
    check.verify()


def _buffers(raw: bytes, off: int) -> int:
    """How many bytes of out-of-band buffers the body at ``off`` holds."""
    nbuf = int.from_bytes(raw[off + 4 : off + 8], "little")
    return sum(
        int.from_bytes(raw[off + 16 + 8 * j : off + 24 + 8 * j], "little") for j in range(nbuf)
    )


def test_damaged_journals_are_skipped_to_the_next_frame(ew_home, tally):
    rng = random.Random(42)
    base = run_base("base-journal")
    check = Checker(tally)
    layouts = {p.stem: frames(p.read_bytes()) for p in (base.path / "journal").glob("*.rec")}
    hows = ["flip", "flip", "cut", "garbage", "delete", "random"]
    for k in range(scaled(60)):
        tally.trial()
        name = f"jr{k}"
        path = clone(base, name)
        wid = rng.choice(sorted(layouts))
        spans = layouts[wid]
        how = hows[k % len(hows)]
        at = damage(rng, path / "journal" / f"{wid}.rec", how)
        if how in ("delete", "random"):
            hit = {t for _, _, ts in spans for t in ts}
            must = hit
        elif how == "flip":
            hit = must = {t for a, b, ts in spans if a <= at < b for t in ts}
        elif how == "cut":
            hit = must = {t for a, b, ts in spans if b > at for t in ts}
        else:  # garbage: the frame it split, if any
            hit = must = {t for a, b, ts in spans if a < at < b for t in ts}
        # (a wait polls every poll_s to find what damage lost: the default, 0.5 s, now and then)
        check.job(name, may_fail=hit, must_fail=must, files=(f"journal/{wid}.rec",), cli=k % 6 == 1,
                  poll_s=0.5 if k % 10 == 0 else 0.05)  # fmt: skip
    check.verify()


def gated(i: int, gate: str, arg):
    """A task that waits for ``gate`` to exist (so its workers hold the job open while the
    payload is damaged), then checks its input and returns it."""
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.005)
    return float(arg[0]) + i


def test_a_damaged_payload_fails_its_tasks_with_the_reason(ew_home, tmp_path, tally):
    rng = random.Random(7)
    check = Checker(tally)
    hows = ["flip", "flip", "cut", "garbage", "delete"]
    n = 24
    for k in range(scaled(12)):
        tally.trial()
        name = f"pay{k}"
        gate = str(tmp_path / f"gate{k}")
        args = [np.full(9000, float(i)) for i in range(n)]  # 72 kB each: a few tasks per chunk
        job = ew.submit(gated, range(n), [gate] * n, args, on=ew.local(cores=2), name=name)
        deadline = time.monotonic() + 30
        while job.check().counts["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        payload = job.path / "payload.log"
        size = payload.stat().st_size
        how = hows[k % len(hows)]
        damage(rng, payload, how, rng.randrange(size // 3, size) if how != "delete" else None)
        Path(gate).touch()
        try:
            job.wait(timeout=60)
        except ew.TimeoutError as exc:
            tally.hang(f"{name}: {exc}")
            continue
        values = job.results()
        failed = 0
        for i, v in enumerate(values):
            if isinstance(v, ew.TaskError):
                failed += 1
                if "payload.log" not in str(v) or v.index != i:
                    check.problem(f"{name}: task {i} failed without naming the payload: {v}")
            elif v != 2.0 * i:
                tally.lose(1, f"{name}: task {i} gave a wrong value {v!r}")
        if failed:
            status = job.check()
            if "damaged: payload.log" not in status.note:
                check.problem(
                    f"{name}: {failed} tasks failed on the payload, but check() says {status}"
                )
            if k % 4 == 0:
                p = run_cli(tally, "status", name)
                if "payload.log" not in p.stdout:
                    check.problem(
                        f"{name}: `elsewhere status` does not say the payload is damaged: {p.stdout}"
                    )
    check.verify()


def test_damaged_job_files_give_a_clear_error_or_are_repaired(ew_home, tally):
    rng = random.Random(11)
    base = run_base("base-files")
    check = Checker(tally)
    hows = ["flip", "cut", "garbage", "random"]
    for k in range(scaled(24)):
        tally.trial()
        name = f"jf{k}"
        path = clone(base, name)
        target = ["job.json", "queue.json", "queue.b.json", "both"][k % 4]
        how = hows[(k // 4) % len(hows)]
        if target == "both":
            for slot in ("queue.json", "queue.b.json"):
                damage(rng, path / slot, "random")
        else:
            damage(rng, path / target, how)
        if target in ("queue.json", "queue.b.json"):  # the other slot holds: read as before
            check.job(
                name, may_fail=set(), must_fail=set(), files=(), cli=k % 3 == 0, damaged=False
            )
            continue
        with pytest.raises(DamagedJob) as info:
            job = ew.recover(name)
            job.wait(timeout=30)
            job.results()
        said = str(info.value)
        want = (
            "damaged: job.json" if target == "job.json" else "damaged: queue.json and queue.b.json"
        )
        if not said.startswith(want):
            check.problem(f"{name}: {said}")
        p = run_cli(tally, "status", name)
        if p.returncode == 0 or want not in p.stderr:
            check.problem(f"{name}: `elsewhere status` gave {p.returncode}: {p.stdout}{p.stderr}")
    check.verify()
