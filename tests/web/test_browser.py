"""The web view in a real browser: ``elsewhere web`` as a process, real jobs on local workers (and
a real peer worker), and headless Chromium driven by Playwright, looking and clicking as a
user does.

With ELSEWHERE_WEB_SCREENSHOTS=1 the same tests save each view into docs/img/web-*.png (with
a larger job beside, so that the pictures show something); CI leaves the tree alone.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from webproc import SCREENSHOTS, free_port, screenshots, wait_until

import elsewhere as ew
from elsewhere.api.web.benchfigures import checkout_figures
from elsewhere.peer import ciphers
from elsewhere.peer.ciphers import CIPHER_ENV
from elsewhere.peer.keys import default_key_path, write_key
from peer.peer_procs import WorkerProc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

VIEWPORT = {"width": 1360, "height": 900}
WAIT_MS = 60_000  # the longest any page waits for what a job does (a loaded machine is slow)


def _gated(i: int, gate: str, fail: int) -> int:
    """A task that waits until the file ``gate`` exists (at most a minute), then prints, and
    fails if it is task ``fail``."""
    import os
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)
    print(f"task {i} says hello")
    if i == fail:
        raise ValueError(f"bad input {i}")
    return i


def _varied(i: int) -> int:
    """A task of the screenshots' larger job: 5 to 60 ms, a few slow ones, a few failures."""
    import random
    import time

    r = random.Random(i)
    time.sleep(r.uniform(0.005, 0.03) * (4 if i % 53 == 0 else 1))
    if i % 157 == 156:
        raise RuntimeError(f"the fit of sample {i} did not converge")
    return i


def _square(x: int) -> int:
    import time

    time.sleep(0.15)
    return x * x


def _noop(x: int) -> int:
    return x


def _mostly(x: int) -> int:
    """A no-op that fails for one task in a thousand (the screenshots' job of 100 000)."""
    if x % 1000 == 999:
        raise ValueError(f"sample {x} is out of range")
    return x


def _gated_job(tmp_path: Path, name: str, n: int = 6, fail: int = 4) -> tuple[ew.Job, Path]:
    gate = tmp_path / f"{name}.go"
    job = ew.submit(_gated, range(n), itertools.repeat(str(gate)), itertools.repeat(fail), name=name,
                    on=ew.local(cores=2))  # fmt: skip
    return job, gate


def _page(browser, errors: list[str]):
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(WAIT_MS)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return page


def _shot(page, name: str) -> None:
    if screenshots():
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"web-{name}.png"))


def test_a_job_moves_live_its_gantt_has_a_bar_per_task_and_a_failure_opens(web, browser, tmp_path):
    if screenshots():  # a larger job first, so that the pictures show something
        ew.submit(_varied, range(1500), name="sweep", on=ew.local(cores=2)).wait(timeout=90)
    w = web()
    _job, gate = _gated_job(tmp_path, "webjob")
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(w.url)
    row = '#jobs tr[data-name="webjob"]'
    page.wait_for_selector(row)
    assert page.get_attribute(row, "data-state") in ("queued", "running")
    page.evaluate("window.sameDocument = 1")  # gone if the page were reloaded
    page.click(row)  # the job's own view, by its address's fragment
    page.wait_for_selector("#job[data-state]")
    assert page.text_content("#job-name") == "webjob"
    assert page.text_content('#counts [data-state="finished"] .n') == "0"

    gate.touch()  # the tasks go on; the page must follow without a reload
    page.wait_for_selector('#job[data-state="failed"]')
    assert page.text_content('#counts [data-state="finished"] .n') == "5"
    assert page.text_content('#counts [data-state="failed"] .n') == "1"
    page.wait_for_function("() => document.querySelector('#gantt').dataset.bars === '6'")
    gantt = page.eval_on_selector("#gantt", "c => ({...c.dataset})")
    assert gantt["tasks"] == "6" and gantt["lanes"] in ("1", "2"), gantt
    assert page.eval_on_selector("#plot-durations", "c => +c.dataset.points") > 0
    page.wait_for_selector('#tasks tr[data-state="failed"]')

    page.click("#nav-jobs")  # the jobs table: the job's counts moved there too
    done = f'{row}[data-state="failed"]'
    page.wait_for_selector(done)
    assert page.text_content(f'{done} .chip[data-state="finished"]') == "5"
    assert page.text_content(f'{done} .chip[data-state="failed"]') == "1"
    assert page.evaluate("window.sameDocument") == 1
    _shot(page, "jobs")

    page.click(row)  # a failed task's traceback: one click away
    page.click('#tasks tr[data-state="failed"]')
    page.wait_for_selector("#task-traceback")
    traceback = page.text_content("#task-traceback")
    assert "ValueError: bad input 4" in traceback and "_gated" in traceback
    assert page.text_content("#task-title") == "Task 4"
    assert "task 4 says hello" in page.text_content("#task-log")
    _shot(page, "task")
    if screenshots():
        page.click("#task-close")
        page.goto(f"{w.url}#/job/{ew.recover('sweep').id}")
        page.wait_for_selector("#gantt[data-ready='1']")
        page.wait_for_timeout(300)
        _shot(page, "job")
    assert not errors, errors


# Where the Gantt shows, on the screen, an aggregated bar (which="bucket": a pixel column of
# at least 2 tasks) or a task's own bar at least 6 pixels wide (which="bar"), from the Gantt's
# own arrays and its own scan of a lane: [x, y, tasks in the column or pixels per task]
# (a bucket from the fraction ``from`` of the width on).
_PLACE = """([which, from]) => {
  const g = S.view.gantt, c = g.canvas.getBoundingClientRect();
  const plotW = c.width - g.labelW - 4, W = Math.ceil(plotW), k = plotW / (g.v1 - g.v0);
  const visible = Math.floor((c.height - g.axisH) / g.laneHeight());
  for (let r = 0; r < Math.min(visible, g.order.length - g.laneOffset); r++) {
    const l = g.order[r + g.laneOffset], y = c.top + g.axisH + r * g.laneHeight() + g.laneHeight() / 2;
    let found = null;
    const bars = [];
    g.scan(l, W, k, (x0, x1) => {
      bars.push([x0, x1]);
      if (!found && which === "bar" && x1 - x0 >= 6 && x0 >= 0 && x1 <= plotW) found = [c.left + g.labelW + (x0 + x1) / 2, y, x1 - x0];
    });
    // a column of several tasks with such columns either side and no bar of its own within
    // 4 px: the pointer's whole-pixel position then hits that bucket, not a neighbour or a bar
    const held = (p) => { let n = 0; for (let q = 0; q < 5; q++) n += g.cells[p * 5 + q]; return n; };
    for (let p = Math.max(1, Math.floor((from || 0) * W)); p < W - 1 && which === "bucket" && !found; p++) {
      if (held(p - 1) < 2 || held(p) < 2 || held(p + 1) < 2) continue;
      if (bars.some(([x0, x1]) => x1 > p - 4 && x0 < p + 5)) continue;
      found = [c.left + g.labelW + p + 0.5, y, held(p)];
    }
    g.cells.fill(0);
    if (found) return found;
  }
  return null;
}"""


def test_a_job_of_100_000_tasks_draws_aggregated_bars_and_zooms_to_its_tasks(web, browser):
    job = ew.submit(_noop, range(100_000), name="hundred-k", on=ew.local(cores=2), seed=False)
    job.wait(timeout=90)
    w = web()
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(f"{w.url}#/job/{job.id}")
    page.wait_for_function("() => document.querySelector('#gantt')?.dataset.tasks === '100000'")
    g = page.eval_on_selector("#gantt", "c => ({...c.dataset})")
    # every task is drawn, nearly all of them inside aggregated bars (1 200 pixels, 100 000 tasks)
    assert int(g["bars"]) + int(g["grouped"]) == 100_000, g
    assert int(g["grouped"]) > 90_000 and 0 < int(g["buckets"]) <= 2 * 1360, g
    assert int(g["rects"]) < 5_000, (
        g
    )  # rectangles drawn: a few per run of pixel columns, not per task
    assert page.eval_on_selector("#plot-durations", "c => +c.dataset.points") > 0
    assert page.eval_on_selector("#plot-throughput", "c => +c.dataset.points") > 0

    x, y, _ = page.evaluate(_PLACE, ["bucket"])  # hovering an aggregated bar says what it holds
    page.mouse.move(x, y)
    page.wait_for_selector('#gantt-tip[data-kind="bucket"]:not([hidden])')
    tip = page.text_content("#gantt-tip")
    assert " tasks at " in tip and "finished" in tip and "click zooms in" in tip, tip
    span = page.evaluate("() => S.view.gantt.v1 - S.view.gantt.v0")
    page.mouse.click(x, y)  # a click zooms into it
    assert page.evaluate("() => S.view.gantt.v1 - S.view.gantt.v0") < span / 3
    for _ in range(80):  # the wheel zooms on, until the tasks are bars of their own
        if page.evaluate(_PLACE, ["bar"]):
            break
        spot = page.evaluate(_PLACE, ["bucket"])  # over tasks, not a gap between runs of them
        if spot:
            page.mouse.move(spot[0], spot[1])
        page.mouse.wheel(0, -600)
    x, y, per = page.evaluate(_PLACE, ["bar"])
    assert per >= 6 and int(page.get_attribute("#gantt", "data-bars")) > 0
    page.mouse.move(x, y)
    page.wait_for_selector('#gantt-tip[data-kind="task"]:not([hidden])')
    tip = page.text_content("#gantt-tip")
    assert tip.startswith("task ") and "finished" in tip, tip
    task = int(tip.split()[1])
    page.mouse.click(x, y)  # and a click on one opens it
    page.wait_for_selector(f'#task-panel[data-task="{task}"]')
    assert page.text_content("#task-title") == f"Task {task}"
    if screenshots():  # a job of 100 000 with a failure in a thousand, from its third task on
        shown = ew.submit(
            _mostly, range(100_000), name="hundred-k", on=ew.local(cores=2), seed=False
        )
        shown.wait(timeout=90)
        page.goto(f"{w.url}#/job/{shown.id}")
        page.wait_for_function("() => document.querySelector('#gantt')?.dataset.tasks === '100000'")
        page.evaluate("""() => { const g = S.view.gantt; let a = Infinity, b = 0;
            for (let j = 0; j < g.E; j++) if (g.first[j] + g.count[j] > 2) { a = Math.min(a, g.start[j]); b = Math.max(b, g.end[j]); }
            g.v0 = a - (b - a) * 0.02; g.v1 = b + (b - a) * 0.02; g.follow = false; g.draw(); }""")  # fmt: skip
        x, y, _ = page.evaluate(_PLACE, ["bucket", 0.45])
        page.mouse.move(x, y)
        page.wait_for_selector(
            "#gantt-tip:not([hidden])"
        )  # (a failed task's own bar, if one is there)
        _shot(page, "gantt")
    assert not errors, errors


def test_the_benchmarks_view_shows_the_figures_it_finds_and_says_when_there_are_none(
    web, browser, tmp_path
):
    figures = tmp_path / "figures"
    figures.mkdir()
    w = web("--bench-figures", str(figures))
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(f"{w.url}#/bench")
    page.wait_for_selector('#bench[data-found="0"]')  # none there (yet): the view says so, and why
    assert f"no benchmark figures in {figures}" in page.text_content("#bench-note")
    assert "--bench-figures" in page.text_content("#bench-none")

    shutil.copy(Path(__file__).with_name("bench_figures.json"), figures / "local.json")
    page.reload()
    page.wait_for_selector('#bench[data-found="1"]')
    assert page.get_attribute("#bench-tabs a[data-active='1']", "data-bench") == "local"
    card = '.measure[data-measure="10 000 no-op tasks from cold"]'
    ours = page.inner_text(f"{card} tr[data-system='ew.map']")
    assert "143 ms" in ours and "0.26x over PPE.map(chunksize)" in ours, ours
    assert "2.92 s" in page.inner_text(f"{card} tr[data-system='loky, one submit per task']")
    assert (
        page.eval_on_selector(f"{card} canvas", "c => +c.dataset.points") == 3
    )  # a bar per system
    sweep = '.measure[data-measure="No-op tasks from cold: tasks per second, by the job\'s size"]'
    assert "582.2k/s" in page.inner_text(f"{sweep} tr[data-tasks='100000']")
    assert (
        page.eval_on_selector(f"{sweep} canvas", "c => +c.dataset.points") == 4
    )  # 2 systems x 2 sizes
    if (
        screenshots()
    ):  # the pictures show this checkout's own figures (named without a machine's path)
        real = web("--bench-figures", os.path.relpath(checkout_figures()))
        page.goto(f"{real.url}#/bench/local")
        page.wait_for_selector('#bench[data-found="1"]')
        page.wait_for_timeout(300)
        _shot(page, "bench")
    assert not errors, errors


def test_cancel_is_refused_without_the_token_and_done_with_it(web, browser, tmp_path):
    w = web()
    job, _gate = _gated_job(tmp_path, "held", n=4, fail=-1)  # its gate never opens
    errors: list[str] = []
    anon = _page(browser, errors)
    anon.goto(f"{w.base}/#/job/{job.id}")  # the page, without its token
    anon.wait_for_selector("#job[data-state]")
    assert "token" in anon.text_content("#mode")
    anon.click("#act-cancel")
    anon.wait_for_selector('#notice[data-kind="error"]')
    said = anon.text_content("#notice")
    assert "refused" in said and "token" in said, said
    assert job.state.value in ("queued", "running")

    page = _page(browser, errors)
    page.goto(f"{w.url}#/job/{job.id}")
    page.wait_for_selector("#job[data-state]")
    assert page.text_content("#mode") == ""
    page.click("#act-cancel")
    page.wait_for_selector('#notice[data-kind="ok"]')
    page.wait_for_selector('#job[data-state="cancelled"]')  # pushed to the page
    anon.wait_for_selector('#job[data-state="cancelled"]')  # and to every page that looks
    assert job.state.value == "cancelled"
    assert not errors, errors


def test_read_only_shows_no_actions_and_refuses_them(web, browser, tmp_path):
    w = web("--read-only")
    job, gate = _gated_job(tmp_path, "looked-at", n=2, fail=-1)
    try:
        errors: list[str] = []
        page = _page(browser, errors)
        page.goto(f"{w.url}#/job/{job.id}")  # even with the token
        page.wait_for_selector("#job[data-state]")
        assert page.text_content("#mode") == "read-only"
        assert page.is_hidden("#job-actions")
        status = page.evaluate(
            "async ([id, token]) => (await fetch(`api/jobs/${id}/cancel`, "
            "{method: 'POST', headers: {'X-Elsewhere-Token': token}})).status",
            [job.id, w.token],
        )
        assert status == 403
        page.click("#tasks tr[data-task='0']")
        page.wait_for_selector("#task-log")
        assert page.query_selector("#act-cancel-task") is None
        assert job.state.value in ("queued", "running")
        assert not errors, errors
    finally:
        gate.touch()
        job.wait(timeout=60)


@pytest.fixture
def peer_worker(ew_home, tmp_path, monkeypatch):
    """A background loopback peer worker (``peer worker --detach``) on a discovery port of its
    own, in this test's home; stopped afterwards by its pid."""
    monkeypatch.setenv("ELSEWHERE_CONFIG", str(tmp_path / "config"))  # no group key: loopback only
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "elsewhere", "peer", "worker", "--detach", "--interface", "127.0.0.1",
                          "--port", str(port), "--slots", "2"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    records = list((ew_home / "peer" / "workers").glob("[0-9]*.json"))
    pid = json.loads(records[0].read_text())["pid"]
    yield port
    try:
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not _alive(pid), 20, f"peer worker {pid} to stop")
    except ProcessLookupError:
        pass
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_peers_view_lists_the_workers_their_ciphers_and_fair_share(web, browser, peer_worker, tmp_path,
                                                                        monkeypatch):  # fmt: skip
    # two more workers in a keyed group (this user holds its key, so the view listens for it):
    # one as it comes, one limited to ChaCha20-Poly1305 (as on a CPU without AES instructions)
    monkeypatch.delenv(CIPHER_ENV, raising=False)
    key = write_key("lab", default_key_path("lab"))
    base = [
        "--port",
        str(peer_worker),
        "--interface",
        "127.0.0.1",
        "--key",
        str(key),
        "--slots",
        "1",
    ]
    keyed = [WorkerProc(base, tmp_path / "w-aes.json"),
             WorkerProc(base, tmp_path / "w-chacha.json", extra_env={CIPHER_ENV: "chacha20"})]  # fmt: skip
    try:
        for p in keyed:
            p.wait_started()
        _peers_and_fair_share(web, browser, peer_worker)
    finally:
        for p in keyed:
            p.stop()


def _peers_and_fair_share(web, browser, peer_worker):
    w = web("--peer-port", str(peer_worker))
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(f"{w.url}#/peers")
    loopback = '#peers tr[data-state="idle"]:has(td.wire[data-encrypt="0"])'
    page.wait_for_selector(loopback)  # as `elsewhere peer list` shows it
    row = page.inner_text(loopback)
    assert "not encrypted (loopback only)" in row and "/2" in row, row
    # the keyed workers: encrypted, with the cipher a connection from here would choose
    try:
        page.wait_for_function(
            "() => document.querySelectorAll('#peers td.wire[data-encrypt=\"1\"]').length === 2"
        )
    except PlaywrightTimeout:
        raise AssertionError(
            f"the keyed workers are not listed: {page.inner_text('#view')}"
        ) from None
    wires = page.eval_on_selector_all(
        '#peers td.wire[data-encrypt="1"]', "tds => tds.map(t => [t.dataset.cipher, t.textContent])"
    )
    mine = ciphers.cipher_towards(ciphers.offered_ciphers())  # the one this machine prefers
    names = {ciphers.AES_GCM: "AES-256-GCM", ciphers.CHACHA: "ChaCha20-Poly1305"}
    assert sorted(map(tuple, wires)) == sorted([(mine, f"encrypted: {names[mine]}"),
                                                (ciphers.CHACHA, "encrypted: ChaCha20-Poly1305")]), wires  # fmt: skip
    t = time.monotonic()
    assert ew.map(_square, range(6), on=ew.peers(port=peer_worker)) == [x * x for x in range(6)]
    # the worker's fair share: the controller's use of it, sampled from its stats file
    page.wait_for_function("() => +(document.querySelector('#fair-share canvas')?.dataset.points || 0) >= 2",
                           timeout=max(10_000, int((time.monotonic() - t) * 1000) + 10_000))  # fmt: skip
    if screenshots():  # a second job, seen while it runs: its controller, a busy worker
        job = ew.submit(_square, range(40), on=ew.peers(port=peer_worker))
        page.wait_for_selector('#peers tr[data-state="controller"]')
        page.wait_for_timeout(2500)
        _shot(page, "peers")
        job.wait(timeout=60)
    assert not errors, errors
