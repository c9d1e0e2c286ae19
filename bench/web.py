"""What the web view costs: the page's first render and its updates for a job of 100 000 tasks,
and the server's CPU while a job of 10 000 tasks runs.

    .venv/bin/python bench/web.py [--tasks 100000] [--cpu-tasks 10000] [--updates 5] [--rounds 3] [--json FILE]

Needs the web extra and a browser: ``pip install -e '.[web,test]'`` (Playwright) and Debian's
Chromium (``ci/services/chromium.sh``). Every measurement runs in a fresh ``ELSEWHERE_HOME``;
``elsewhere web`` is a real process, the page a real headless Chromium.

1. **First render, 100 000 tasks.** A job of ``--tasks`` no-op tasks is run for real on two
   local workers; the fast tasks run in batches, so the journal holds a few dozen range
   records (``batches``). The same job is then rewritten through the folder layer with one
   record per task (``single records``, the worst case: 100 000 timeline entries), its tasks
   spread over the batches' times. For each, the time from opening the job's page to the
   Gantt, the plots and the first page of the task table drawn (median of ``--rounds`` fresh
   pages; the first one also pays the server's first read of the job), and the share of it
   the page spends drawing.
2. **Updates, 100 000 tasks.** The last tasks' records are held back, and written to the
   journal in ``--updates`` steps while the page is open: the time from each write to the
   page showing the new counts (pushed: the server looks every 0.25 s) and to the Gantt
   redrawn with them (fetched and drawn again).
3. **Server CPU, 10 000 tasks.** A job of ``--cpu-tasks`` tasks of 2 ms each runs twice on
   two local workers: alone, then with ``elsewhere web`` serving a page open on it. The
   server's CPU time while the job ran, as a share of one core (its CPU over the job's wall
   time), and the job's wall time with the page open over without (the slowdown); then the
   server's CPU over 5 s of a page open on the finished job (idle).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt_time, median, proc_cpu_s, stop_workers, table, venv_python

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
VIEWPORT = {"width": 1360, "height": 900}


def noop(x: int) -> int:
    return x


def two_ms(x: int) -> int:
    time.sleep(0.002)
    return x


# -- homes, servers, pages ------------------------------------------------------------------
@contextmanager
def fresh_home() -> Iterator[Path]:
    """A new ELSEWHERE_HOME for this process and its children; its workers stopped after."""
    home = Path(tempfile.mkdtemp(prefix="ew-bench-web-"))
    old = os.environ.get("ELSEWHERE_HOME")
    os.environ["ELSEWHERE_HOME"] = str(home)
    try:
        yield home
    finally:
        import elsewhere as ew

        stop_workers(home, shutdown=lambda: ew.local().shutdown())
        if old is None:
            os.environ.pop("ELSEWHERE_HOME", None)
        else:
            os.environ["ELSEWHERE_HOME"] = old
        shutil.rmtree(home, ignore_errors=True)


@contextmanager
def web_server() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``elsewhere web --port 0`` on this home: (process, URL with the token)."""
    log = tempfile.NamedTemporaryFile(prefix="ew-bench-web-", suffix=".log", delete=False)
    proc = subprocess.Popen([venv_python(), "-m", "elsewhere", "web", "--port", "0"], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while b"\n" not in Path(log.name).read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"elsewhere web did not start: {Path(log.name).read_text()}")
            time.sleep(0.02)
        yield proc, Path(log.name).read_text().splitlines()[0].strip()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
        os.unlink(log.name)


def open_job_page(
    browser: Any, url: str, job_id: str, want_tasks: int
) -> tuple[Any, dict[str, float]]:
    """A new page on the job's view; (page, times in seconds: until everything is drawn, and
    the page's own drawing time)."""
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(120_000)
    page.on("pageerror", lambda exc: print(f"  page error: {exc}", flush=True))
    t = time.perf_counter()
    page.goto(f"{url}#/job/{job_id}")
    page.wait_for_function(
        f"() => document.querySelector('#gantt')?.dataset.tasks === '{want_tasks}'"
    )
    page.wait_for_selector("#tasks tr[data-task]")
    page.wait_for_function(
        "() => +(document.querySelector('#plot-durations')?.dataset.points || 0) > 0"
    )
    wall = time.perf_counter() - t
    d = page.eval_on_selector("#gantt", "c => ({...c.dataset})")
    return page, {
        "first": wall,
        "render": float(d["renderMs"]) / 1e3,
        "draw": float(d["drawMs"]) / 1e3,
    }


# -- the 100 000-task job ----------------------------------------------------------------------
def make_big_job(n: int) -> tuple[Any, float]:
    """Run ``n`` no-op tasks for real; (the job, its wall time)."""
    import elsewhere as ew

    t = time.perf_counter()
    job = ew.submit(noop, range(n), name=f"noop-{n}", on=ew.local(cores=2), seed=False)
    job.wait(timeout=600)
    return job, time.perf_counter() - t


def rewrite(
    job: Any, *, singles: bool, hold: int, piece: int = 100
) -> tuple[int, list[tuple[str, list[Any]]]]:
    """Rewrite the job's journals through the folder layer: one record per task if ``singles``,
    the records of the last ``hold`` tasks left out (a batch across that line cut in two, and
    the held ones into batches of ``piece`` tasks, as if written in several frames); returns
    how many records are left, and the held ones per worker, to be written later (:func:`append`)."""
    from elsewhere.folder import records
    from elsewhere.folder.store import atomic_write

    store = job.store
    held: list[tuple[str, list[Any]]] = []
    kept = 0
    n = job.n_tasks
    cuts = list(range(n - hold, n, piece))
    for wid in store.workers():
        with open(store.journal_path(wid), "rb") as f:
            recs, _ = records.parse_frames(f.read())
        out: list[Any] = []
        for r in recs:
            parts = [r]
            for at in cuts if r.count > 1 else ():
                last = parts[-1]
                if last.task < at < last.task + last.count:
                    parts[-1:] = list(_cut(last, at))
            for q in parts:
                if singles and q.count > 1:
                    out += list(_cut_all(q))
                else:
                    out.append(q)
        keep = [r for r in out if r.task < n - hold]
        later = [r for r in out if r.task >= n - hold]
        atomic_write(store.journal_path(wid), records.pack_frame(keep) if keep else b"")
        kept += len(keep)
        if later:
            held.append((wid, later))
    return kept, held


def _cut(r: Any, at: int) -> tuple[Any, Any]:
    """A range record as two: its tasks before ``at``, and from ``at`` on (their times shared
    out evenly, their values at the same places of the same body)."""
    step = (r.t_end - r.t_start) / r.count
    k = at - r.task
    first = r._replace(count=k, t_end=r.t_start + k * step)
    return first, r._replace(
        task=at, item=r.item + k, count=r.count - k, t_start=first.t_end, log_len=0
    )


def _cut_all(r: Any) -> Iterator[Any]:
    """A range record as one record per task."""
    step = (r.t_end - r.t_start) / r.count
    for k in range(r.count):
        yield r._replace(task=r.task + k, item=r.item + k, count=1, log_len=0 if k else r.log_len,
                         t_start=r.t_start + k * step, t_end=r.t_start + (k + 1) * step)  # fmt: skip


def append(job: Any, held: list[tuple[str, list[Any]]], part: int, parts: int) -> int:
    """Write part ``part`` of ``parts`` of the held records (as their workers would: whole
    frames appended); returns how many tasks they hold."""
    from elsewhere.folder import records

    tasks = 0
    for wid, recs in held:
        size = -(-len(recs) // parts)
        chunk = recs[part * size : (part + 1) * size]
        if chunk:
            fd = os.open(job.store.journal_path(wid), os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, records.pack_frame(chunk))
            finally:
                os.close(fd)
            tasks += sum(r.count for r in chunk)
    return tasks


def bench_big(browser: Any, n: int, updates: int, rounds: int,
              raw: dict[str, dict[str, float]] | None = None) -> list[list[str]]:  # fmt: skip
    """The table's rows; ``raw`` gets each journal's figures in seconds (for ``--json``)."""
    rows = []
    for singles in (False, True):
        with fresh_home():
            job, run_s = make_big_job(n)
            n_records, held = rewrite(job, singles=singles, hold=updates * 100)
            shown = n - sum(r.count for _, recs in held for r in recs)
            what = "single records" if singles else "batches"
            print(f"  {what}: {n} no-op tasks ran in {fmt_time(run_s)}; {n_records} records; holding "
                  f"back {n - shown} tasks for the updates", flush=True)  # fmt: skip
            with web_server() as (_proc, url):
                firsts, renders = [], []
                page = None
                for _ in range(rounds):
                    if page is not None:
                        page.close()
                    page, times = open_job_page(browser, url, job.id, shown)
                    firsts.append(times["first"])
                    renders.append(times["render"])
                counts_s, gantt_s = [], []
                for part in range(updates):
                    before = page.eval_on_selector("#gantt", "c => +c.dataset.loads")
                    t = time.perf_counter()
                    shown += append(job, held, part, updates)
                    page.wait_for_function(f"() => document.querySelector('#counts [data-state=\"finished\"] .n')"
                                           f".textContent === '{shown}'")  # fmt: skip
                    counts_s.append(time.perf_counter() - t)
                    page.wait_for_function(f"() => +document.querySelector('#gantt').dataset.tasks === {shown} "
                                           f"&& +document.querySelector('#gantt').dataset.loads > {before}")  # fmt: skip
                    gantt_s.append(time.perf_counter() - t)
                update_render = (
                    float(page.eval_on_selector("#gantt", "c => c.dataset.renderMs")) / 1e3
                )
                page.close()
            rows.append([what, str(n_records), fmt_time(firsts[0]), fmt_time(median(firsts[1:] or firsts)),
                         fmt_time(median(renders)), fmt_time(median(counts_s)), fmt_time(max(counts_s)),
                         fmt_time(median(gantt_s)), fmt_time(update_render)])  # fmt: skip
            if raw is not None:
                raw[what] = {"records": n_records, "first_cold": firsts[0], "first": median(firsts[1:] or firsts),
                             "counts": median(counts_s), "gantt": median(gantt_s)}  # fmt: skip
    return rows


# -- server CPU while a job runs ---------------------------------------------------------------------
def run_cpu_job(n: int) -> Any:
    import elsewhere as ew

    return ew.submit(two_ms, range(n), name=f"two-ms-{n}", on=ew.local(cores=2), seed=False)


def browser_cpu_s() -> float:
    """CPU-seconds of the browser's processes (Chromium's, started by Playwright's driver)."""
    import psutil

    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            if "chrom" in p.name():
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            continue
    return total


def bench_cpu(browser: Any, n: int, rounds: int) -> tuple[list[list[str]], dict[str, float]]:
    """The job alone and with a page open on it, in turns, ``rounds`` times each."""
    import elsewhere as ew

    alone, watched, server, chrome, loads = [], [], [], [], []
    idle = 0.0
    with fresh_home():
        ew.map(noop, range(4), on=ew.local(cores=2))  # warm workers for every run
        with web_server() as (proc, url):
            for _ in range(rounds):
                t = time.perf_counter()
                run_cpu_job(n).wait(timeout=600)
                alone.append(time.perf_counter() - t)
                page = browser.new_page(viewport=VIEWPORT)
                page.goto(url)
                page.wait_for_selector("#jobs tbody tr")
                cpu0, chrome0 = proc_cpu_s(proc.pid), browser_cpu_s()
                t = time.perf_counter()
                job = run_cpu_job(n)
                page.goto(f"{url}#/job/{job.id}")
                job.wait(timeout=600)
                watched.append(time.perf_counter() - t)
                server.append(proc_cpu_s(proc.pid) - cpu0)
                chrome.append(browser_cpu_s() - chrome0)
                page.wait_for_selector('#job[data-state="finished"]')
                loads.append(page.eval_on_selector("#gantt", "c => +c.dataset.loads"))
                if len(alone) == rounds:
                    time.sleep(1.0)
                    idle0 = proc_cpu_s(proc.pid)
                    time.sleep(5.0)
                    idle = (proc_cpu_s(proc.pid) - idle0) / 5.0
                page.close()
    w, s, c = median(watched), median(server), median(chrome)
    rows = [
        ["job alone", fmt_time(median(alone)), "", "", ""],
        ["job with a page open on it", fmt_time(w), f"{s:.2f} s", f"{s / w:.1%}", f"{c:.2f} s"],
        ["a page open on the finished job, 5 s", "", f"{idle * 5:.2f} s", f"{idle:.1%}", ""],
    ]
    return rows, {
        "slowdown": w / median(alone),
        "loads": median(loads),
        "server": s / w,
        "idle": idle,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--cpu-tasks", type=int, default=10_000)
    ap.add_argument("--updates", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)"
    )
    args = ap.parse_args()
    from report import Figures

    record = Figures("web", sys.argv[1:])
    raw: dict[str, dict[str, float]] = {}
    print(f"load {os.getloadavg()[0]:.2f} at the start", flush=True)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sys.exit("bench/web.py needs Playwright: pip install -e '.[web,test]'")
    if not os.access(CHROMIUM, os.X_OK):
        sys.exit(f"bench/web.py needs {CHROMIUM}: ci/services/chromium.sh installs it")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        print(
            f"1, 2. a job of {args.tasks} tasks: first render, then {args.updates} updates",
            flush=True,
        )
        big = bench_big(browser, args.tasks, args.updates, args.rounds, raw)
        print(f"3. server CPU while a job of {args.cpu_tasks} tasks of 2 ms runs", flush=True)
        cpu_rows, figures = bench_cpu(browser, args.cpu_tasks, args.rounds)
        browser.close()
    print()
    print(table(["journal", "records", "first render (cold server)", f"first render (median of {args.rounds - 1 or 1})",
                 "of which drawing", "update: counts shown (median)", "(max)", "update: Gantt redrawn (median)",
                 "drawing an update"], big))  # fmt: skip
    print()
    print(
        table(
            ["run (medians)", "job wall time", "server CPU", "server CPU / wall", "browser CPU"],
            cpu_rows,
        )
    )
    print()
    print(
        f"ratio: the job's wall time with the page open / alone = {figures['slowdown']:.2f} "
        f"(the page fetched the Gantt {figures['loads']:.0f} times while the job ran)"
    )
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        tasks = f"{args.tasks:_} tasks".replace("_", " ")
        for what, r in raw.items():
            journal = f"a job of {tasks} ({r['records']:.0f} journal records: {what})"
            for key, label in (("first_cold", "first render, the server's first read"), ("first", "first render"),
                               ("counts", "a journal update to the counts shown"),
                               ("gantt", "a journal update to the Gantt redrawn")):  # fmt: skip
                record.add(
                    "page",
                    f"{label.capitalize()}, {journal}",
                    "elsewhere web",
                    r[key],
                    "s",
                    elsewhere=True,
                )
        cpu = f"a job of {args.cpu_tasks:_} tasks of 2 ms on 2 local workers".replace("_", " ")
        record.add("cpu", f"The server's CPU while a page is open on {cpu}, share of one core", "elsewhere web",
                   100 * figures["server"], "%", elsewhere=True)  # fmt: skip
        record.add("cpu", f"The job's wall time with the page open over alone, {cpu}", "elsewhere web",
                   figures["slowdown"], "x", elsewhere=True)  # fmt: skip
        record.add("cpu", "The server's CPU with a page open on a finished job, share of one core", "elsewhere web",
                   100 * figures["idle"], "%", elsewhere=True)  # fmt: skip
        record.write(args.json)


if __name__ == "__main__":
    main()
