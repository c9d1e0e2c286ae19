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
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from webproc import SCREENSHOTS, free_port, screenshots, wait_until

import elsewhere as ew

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


def test_the_peers_view_lists_the_workers_and_their_fair_share(web, browser, peer_worker):
    w = web("--peer-port", str(peer_worker))
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(f"{w.url}#/peers")
    page.wait_for_selector('#peers tr[data-state="idle"]')  # as `elsewhere peer list` shows it
    row = page.inner_text('#peers tr[data-state="idle"]')
    assert "loopback" in row and "/2" in row, row
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
