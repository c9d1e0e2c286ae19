"""What the web view costs: the page's first render and its updates for a job of 100 000 tasks,
and the server's CPU while a job of 10 000 tasks runs, each beside what a user without the
page runs instead: ``elsewhere status`` (the same counts, as text, from a fresh process).

    .venv/bin/python bench/web.py [--tasks 100000] [--cpu-tasks 10000] [--updates 5] [--rounds 3] [--json FILE]

Needs the web extra and a browser: ``pip install -e '.[web,test]'`` (Playwright) and Debian's
Chromium (``ci/services/chromium.sh``). Every measurement runs in a fresh ``ELSEWHERE_HOME``;
``elsewhere web`` is a real process, the page a real headless Chromium. A wait that times out
is reported as such (n/a) and the run goes on to its end.

1. **First render, 100 000 tasks.** A job of ``--tasks`` no-op tasks is run for real on two
   local workers; the fast tasks run in batches, so the journal holds a few dozen range
   records (``batches``). The same job is then rewritten through the folder layer with one
   record per task (``single records``, the worst case: 100 000 timeline entries), its tasks
   spread over the batches' times. For each: the time from opening the job's page to the
   Gantt, the plots and the first page of the task table drawn (the first page after the
   server started, which also pays the server's first read of the job; then the median of
   ``--rounds`` fresh pages), the page's own share of it (decoding and drawing), and one
   redraw of the whole Gantt; beside it, ``elsewhere status JOB`` (median of ``--rounds``).
2. **Updates, 100 000 tasks.** The last tasks' records are held back, and written to the
   journal in ``--updates`` steps while the page is open: the time from each write to the
   page showing the new counts (pushed: the server looks every 0.25 s) and to the Gantt
   redrawn with them (fetched and drawn again); beside it, ``elsewhere status JOB`` run
   after each write.
3. **Server CPU, 10 000 tasks.** A job of ``--cpu-tasks`` tasks of 2 ms each runs on two
   local workers, in turns: alone; with ``elsewhere web`` serving a page open on it; and with
   ``elsewhere status JOB`` run every second (as ``watch -n 1`` would) instead. The CPU each
   took while the job ran, as a share of one core, and the job's wall time over its time
   alone; then the server's CPU over 5 s of a page open on the finished job (idle).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt_time, median, proc_cpu_s, stop_workers, table, venv_python

NAN = float("nan")
SHOWN_JS = (
    "n => document.querySelector('#counts [data-state=\"finished\"] .n').textContent === String(n)"
)
DRAWN_JS = ("([n, b]) => +document.querySelector('#gantt').dataset.tasks === n "
            "&& +document.querySelector('#gantt').dataset.loads > b")  # fmt: skip

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
    """A new page on the job's view; (page, times in seconds: until everything is drawn, the
    page's own share of it (decoding the timeline, drawing the Gantt and the plots), and one
    redraw of the whole Gantt (the median of 5: what a zoom or a pan costs))."""
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
    redraw = page.evaluate("""() => { const g = S.view.gantt, ms = [];
        for (let i = 0; i < 5; i++) { const t = performance.now(); g.fit(); g.draw(); ms.push(performance.now() - t); }
        return ms.sort((a, b) => a - b)[2]; }""")  # fmt: skip
    return page, {"first": wall, "render": float(d["renderMs"]) / 1e3, "redraw": redraw / 1e3,
                  "grouped": int(d["grouped"]), "buckets": int(d["buckets"])}  # fmt: skip


def status_s(job_id: str) -> float:
    """The wall time of ``elsewhere status JOB`` in a fresh process (what a user without the
    page runs to see the counts)."""
    t = time.perf_counter()
    subprocess.run([venv_python(), "-m", "elsewhere", "status", job_id], check=True, capture_output=True,
                   timeout=300)  # fmt: skip
    return time.perf_counter() - t


def waited(what: str, wait: Any, *args: Any, **kwargs: Any) -> float:
    """Seconds until ``wait(*args, **kwargs)`` returned, or NaN (said) if it timed out: the run
    goes on."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    t = time.perf_counter()
    try:
        wait(*args, **kwargs)
    except PlaywrightTimeout:
        print(f"  timed out waiting for {what}", flush=True)
        return NAN
    return time.perf_counter() - t


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


@contextmanager
def still_running(job: Any, held: list[tuple[str, list[Any]]]) -> Iterator[None]:
    """The workers whose records :func:`rewrite` held back look as if they still ran those
    tasks, until the block ends: each an active member of the job again, its lock held by
    this process, as a live worker holds it. (They left when the job ended; a folder whose
    workers all left while the last records of a journal are missing is damaged, and the
    first look at it, ``elsewhere status`` or the server's, fails those tasks as damaged:
    then the page had no update to show, and the waits for it timed out.)"""
    import fcntl

    store = job.store
    fds = []
    try:
        with store.locked_queue() as q:
            for wid, _ in held:
                q.set_member(wid, "active")
                fd = os.open(q.members[wid].get("lock") or store._p("workers", f"{wid}.cur"), os.O_RDWR)
                fds.append(fd)
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
        with store.locked_queue() as q:
            for wid, _ in held:
                q.set_member(wid, "left")
    finally:
        for fd in fds:
            os.close(fd)


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


def bench_big(browser: Any, n: int, updates: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Per journal (``batches``, ``single records``): its figures in seconds (NaN: timed out)."""
    out: dict[str, dict[str, Any]] = {}
    for singles in (False, True):
        with fresh_home():
            job, run_s = make_big_job(n)
            n_records, held = rewrite(job, singles=singles, hold=updates * 100)
            shown = n - sum(r.count for _, recs in held for r in recs)
            what = "single records" if singles else "batches"
            print(f"  {what}: {n} no-op tasks ran in {fmt_time(run_s)}; {n_records} records; holding "
                  f"back {n - shown} tasks for the updates", flush=True)  # fmt: skip
            with still_running(job, held):
                status = [status_s(job.id) for _ in range(rounds)]
                with web_server() as (_proc, url):
                    pages: list[dict[str, float]] = []
                    page = None
                    for _ in range(rounds + 1):  # the first page also pays the server's first read
                        if page is not None:
                            page.close()
                        page, times = open_job_page(browser, url, job.id, shown)
                        pages.append(times)
                    counts_s, gantt_s, status_after = [], [], []
                    for part in range(updates):
                        before = page.eval_on_selector("#gantt", "c => +c.dataset.loads")
                        t = time.perf_counter()
                        shown += append(job, held, part, updates)
                        counts = waited(
                            "the new counts",
                            page.wait_for_function,
                            SHOWN_JS,
                            arg=shown,
                            timeout=30_000,
                        )
                        gantt = waited("the Gantt redrawn", page.wait_for_function, DRAWN_JS, arg=[shown, before],
                                       timeout=30_000)  # fmt: skip
                        counts_s.append(counts)
                        gantt_s.append(time.perf_counter() - t if gantt == gantt else NAN)
                        status_after.append(status_s(job.id))
                    update_render = (
                        float(page.eval_on_selector("#gantt", "c => c.dataset.renderMs")) / 1e3
                    )
                    page.close()
            warm = pages[1:]
            out[what] = {
                "records": n_records, "status": median(status), "first_cold": pages[0]["first"],
                "first": median(p["first"] for p in warm), "render": median(p["render"] for p in warm),
                "redraw": median(p["redraw"] for p in warm), "grouped": pages[-1]["grouped"],
                "buckets": pages[-1]["buckets"], "counts": median(counts_s), "counts_max": max(counts_s),
                "gantt": median(gantt_s), "gantt_max": max(gantt_s), "update_render": update_render,
                "status_after": median(status_after), "timeouts": sum(x != x for x in counts_s + gantt_s),
            }  # fmt: skip
    return out


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


def children_cpu_s() -> float:
    """CPU-seconds of this process's children that ended (``elsewhere status`` runs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def status_every_second(job_id: str, done: threading.Event, runs: list[int]) -> None:
    """``elsewhere status JOB`` every second until ``done`` (as ``watch -n 1``); how many ran
    goes to ``runs``."""
    n = 0
    while not done.is_set():
        t = time.monotonic()
        subprocess.run(
            [venv_python(), "-m", "elsewhere", "status", job_id], capture_output=True, timeout=300
        )
        n += 1
        done.wait(max(0.0, 1.0 - (time.monotonic() - t)))
    runs.append(n)


def bench_cpu(browser: Any, n: int, rounds: int) -> dict[str, float]:
    """The job alone, with a page open on it, and watched by ``elsewhere status`` every second,
    in turns, ``rounds`` times each; medians."""
    import elsewhere as ew

    alone, paged, polled = [], [], []
    server, chrome, status_cpu, loads, runs = [], [], [], [], []
    idle = NAN
    with fresh_home():
        ew.map(noop, range(4), on=ew.local(cores=2))  # warm workers for every run
        with web_server() as (proc, url):
            for r in range(rounds):
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
                paged.append(time.perf_counter() - t)
                server.append(proc_cpu_s(proc.pid) - cpu0)
                chrome.append(browser_cpu_s() - chrome0)
                waited(
                    "the finished job on the page",
                    page.wait_for_selector,
                    '#job[data-state="finished"]',
                )
                loads.append(page.eval_on_selector("#gantt", "c => +c.dataset.loads"))
                if r == rounds - 1:
                    time.sleep(1.0)
                    idle0 = proc_cpu_s(proc.pid)
                    time.sleep(5.0)
                    idle = (proc_cpu_s(proc.pid) - idle0) / 5.0
                page.close()

                done = threading.Event()
                cpu0 = children_cpu_s()
                t = time.perf_counter()
                job = run_cpu_job(n)
                watcher = threading.Thread(target=status_every_second, args=(job.id, done, runs))
                watcher.start()
                job.wait(timeout=600)
                polled.append(time.perf_counter() - t)
                done.set()
                watcher.join(300)
                status_cpu.append(children_cpu_s() - cpu0)
    w, p = median(paged), median(polled)
    return {"alone": median(alone), "paged": w, "polled": p, "server": median(server), "chrome": median(chrome),
            "status": median(status_cpu), "server_share": median(server) / w, "status_share": median(status_cpu) / p,
            "slowdown": w / median(alone), "status_slowdown": p / median(alone), "idle": idle,
            "loads": median(loads), "runs": median(runs)}  # fmt: skip


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
        big = bench_big(browser, args.tasks, args.updates, args.rounds)
        print(f"3. CPU while a job of {args.cpu_tasks} tasks of 2 ms runs", flush=True)
        cpu = bench_cpu(browser, args.cpu_tasks, args.rounds)
        browser.close()
    tasks = f"{args.tasks:_}".replace("_", " ")
    print()
    print(f"A job of {tasks} tasks (the page: elsewhere web and a headless Chromium; beside it, "
          "`elsewhere status JOB` in a fresh process):")  # fmt: skip
    rows = []
    for what, r in big.items():
        rows.append([f"{what} ({r['records']} records)", fmt_time(r["first_cold"]), fmt_time(r["first"]),
                     fmt_time(r["render"]), fmt_time(r["redraw"]), fmt_time(r["status"]),
                     f"{fmt_time(r['counts'])} (max {fmt_time(r['counts_max'])})",
                     f"{fmt_time(r['gantt'])} (max {fmt_time(r['gantt_max'])})", fmt_time(r["status_after"])])  # fmt: skip
    print(table(["journal", "first render, server's first read", f"first render (median of {args.rounds})",
                 "of which the page's own", "a Gantt redraw", "elsewhere status",
                 f"update: counts shown (median of {args.updates})", "update: Gantt redrawn",
                 "elsewhere status after an update"], rows))  # fmt: skip
    for what, r in big.items():
        print(
            f"  {what}: the Gantt drew {r['grouped']} tasks in {r['buckets']} aggregated bars"
            + (f"; {r['timeouts']} waits timed out" if r["timeouts"] else "")
        )
    print()
    cpus = f"{args.cpu_tasks:_}".replace("_", " ")
    print(f"A job of {cpus} tasks of 2 ms on two local workers (medians of {args.rounds}):")
    print(table(["watched by", "job wall time", "its CPU", "share of one core", "job time / alone", "browser CPU"], [
        ["nothing", fmt_time(cpu["alone"]), "", "", "", ""],
        ["a page of elsewhere web", fmt_time(cpu["paged"]), f"{cpu['server']:.2f} s (server)",
         f"{cpu['server_share']:.1%}", f"{cpu['slowdown']:.2f}", f"{cpu['chrome']:.2f} s"],
        ["elsewhere status every second", fmt_time(cpu["polled"]), f"{cpu['status']:.2f} s ({cpu['runs']:.0f} runs)",
         f"{cpu['status_share']:.1%}", f"{cpu['status_slowdown']:.2f}", ""],
        ["a page open on the finished job, 5 s", "", f"{cpu['idle'] * 5:.2f} s (server)", f"{cpu['idle']:.1%}", "", ""],
    ]))  # fmt: skip
    print(f"(the page fetched the Gantt {cpu['loads']:.0f} times while the job ran)")
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        status = "elsewhere status"
        for what, r in big.items():
            job = f"a job of {tasks} tasks ({r['records']} journal records: {what})"
            record.compare("page", f"First render, {job}", ("elsewhere web", r["first"]), [(status, r["status"])], "s",
                           variants=[("elsewhere web, the server's first read", r["first_cold"])])  # fmt: skip
            record.add("page", f"A redraw of the whole Gantt, {job}", "elsewhere web", r["redraw"], "s",
                       elsewhere=True)  # fmt: skip
            record.compare("page", f"A journal update to the counts shown, {job}", ("elsewhere web", r["counts"]),
                           [(f"{status}, run after it", r["status_after"])], "s")  # fmt: skip
            record.add("page", f"A journal update to the Gantt redrawn, {job}", "elsewhere web", r["gantt"], "s",
                       elsewhere=True)  # fmt: skip
        job = f"a job of {cpus} tasks of 2 ms on 2 local workers".replace("_", " ")
        record.compare("cpu", f"CPU of what watches {job}, share of one core", ("elsewhere web", 100 * cpu["server_share"]),
                       [(f"{status} every second", 100 * cpu["status_share"])], "%")  # fmt: skip
        record.compare("cpu", f"The job's wall time while watched over alone, {job}", ("elsewhere web", cpu["slowdown"]),
                       [(f"{status} every second", cpu["status_slowdown"])], "x")  # fmt: skip
        record.add("cpu", "The server's CPU with a page open on a finished job, share of one core", "elsewhere web",
                   100 * cpu["idle"], "%", elsewhere=True)  # fmt: skip
        record.write(args.json)


if __name__ == "__main__":
    main()
