"""Who may do what with the web view, over plain HTTP (no browser): the token rules on a real
``elsewhere web`` process, read-only, the Host check, a server bound beyond loopback, the
event stream, and the error that names the extra when Starlette is missing."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import urllib.request

import pytest
from webproc import SRC

import elsewhere as ew
from elsewhere.api.web.access import Rules, is_loopback

TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1:8765", True), ("localhost:8765", True), ("[::1]:8765", True), ("127.9.9.9", True),
    ("app.localhost", True), ("localhost.example.org", False), ("example.org:8765", False),
    ("10.0.0.1", False), ("0.0.0.0", False), ("", False),
])  # fmt: skip
def test_loopback_names(host, loopback):
    assert is_loopback(host) is loopback


def test_the_rules():
    local = Rules(TOKEN, loopback=True)
    ok = {"header": None, "query": None, "cookie": None}
    assert (
        local.refusal("GET", "127.0.0.1:1", **ok) is None
    )  # looking, on loopback: no token needed
    assert "loopback" in local.refusal("GET", "attacker.example:1", **ok)  # DNS rebinding
    assert "token" in local.refusal("POST", "127.0.0.1:1", **ok)
    assert "token" in local.refusal(
        "POST", "127.0.0.1:1", header="wrong" * 8, query=None, cookie=None
    )
    assert "token" in local.refusal(
        "POST", "127.0.0.1:1", header=None, query=TOKEN, cookie=TOKEN
    )  # not from a link
    assert local.refusal("POST", "127.0.0.1:1", header=TOKEN, query=None, cookie=None) is None
    ro = Rules(TOKEN, loopback=True, read_only=True)
    assert "read-only" in ro.refusal("POST", "localhost", header=TOKEN, query=None, cookie=None)
    wide = Rules(TOKEN, loopback=False)
    assert "every request" in wide.refusal("GET", "host.example", **ok)
    for given in ({"header": TOKEN}, {"query": TOKEN}, {"cookie": TOKEN}):
        assert wide.refusal("GET", "host.example", **{**ok, **given}) is None
    with pytest.raises(ValueError):
        Rules("short", loopback=True)


def _held(i: int, gate: str) -> int:
    import os
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)
    if i == 1:
        raise KeyError(f"no sample {i}")
    return i


def _job(tmp_path, name, n=3):
    gate = tmp_path / f"{name}.go"
    return ew.submit(
        _held, range(n), itertools.repeat(str(gate)), name=name, on=ew.local(cores=2)
    ), gate


@pytest.mark.integration
def test_actions_need_the_token(web, tmp_path):
    w = web()
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[0-9a-f]{48}", w.url), (
        w.url
    )  # the first line
    job, gate = _job(tmp_path, "guarded")
    status, body = w.request("/api/jobs")  # looking needs no token on loopback
    assert status == 200 and [r["name"] for r in json.loads(body)["jobs"]] == ["guarded"]
    for token in (None, "f" * 48):
        status, body = w.request(f"/api/jobs/{job.id}/cancel", method="POST", token=token)
        assert status == 403 and "token" in body
    status, body = w.request(
        f"/api/jobs/{job.id}/cancel?token={w.token}", method="POST"
    )  # a link cannot act
    assert status == 403
    status, _ = w.request("/api/info", headers={"Host": "attacker.example:80"})
    assert status == 403
    assert job.state.value in ("queued", "running")
    status, body = w.request(f"/api/jobs/{job.id}/cancel", method="POST", token=w.token)
    assert status == 200 and "cancelled job 'guarded'" in json.loads(body)["message"]
    assert job.state.value == "cancelled"
    gate.touch()


@pytest.mark.integration
def test_retry_purge_and_the_task_api(web, tmp_path):
    w = web()
    job, gate = _job(tmp_path, "twice")
    gate.touch()
    job.wait(timeout=60)
    status, body = w.request(f"/api/jobs/{job.id}/tasks?state=failed")
    page = json.loads(body)
    assert status == 200 and page["total"] == 1 and page["rows"][0]["task"] == 1
    assert page["rows"][0]["reason"].startswith("KeyError")
    task = json.loads(w.request(f"/api/jobs/{job.id}/tasks/1")[1])
    assert task["error"]["type"] == "KeyError" and "_held" in task["error"]["traceback"]
    assert w.request(f"/api/jobs/{job.id}/tasks/7")[0] == 404
    status, body = w.request(f"/api/jobs/{job.id}/retry", method="POST", token=w.token)
    assert status == 200 and "running 1 task" in json.loads(body)["message"]
    job.wait(timeout=60)
    assert json.loads(w.request(f"/api/jobs/{job.id}/tasks/1")[1])["attempt"] == 1
    status, body = w.request(f"/api/jobs/{job.id}/purge", method="POST", token=w.token)
    assert status == 200 and "purged" in body
    assert not job.path.exists()
    assert w.request(f"/api/jobs/{job.id}")[0] == 404
    assert json.loads(w.request("/api/jobs")[1])["jobs"] == []


@pytest.mark.integration
def test_read_only_refuses_every_action(web, tmp_path):
    w = web("--read-only")
    job, gate = _job(tmp_path, "untouchable", n=2)
    for verb in ("cancel", "retry", "purge", "tasks/0/cancel"):
        status, body = w.request(f"/api/jobs/{job.id}/{verb}", method="POST", token=w.token)
        assert status == 403 and "read-only" in body, verb
    assert json.loads(w.request("/api/info")[1])["read_only"] is True
    gate.touch()
    job.wait(timeout=60)
    assert job.path.exists()


@pytest.mark.integration
def test_bound_beyond_loopback_every_request_needs_the_token(web):
    w = web("--host", "0.0.0.0")  # reached here over 127.0.0.1 only
    port = w.url.split("/?", 1)[0].rsplit(":", 1)[1]
    w.url = f"http://127.0.0.1:{port}/?token={w.token}"
    for path in ("/", "/static/app.js", "/api/jobs", "/api/events"):
        status, body = w.request(path)
        assert status == 403 and "token" in body, path
    req = urllib.request.Request(w.url)
    with urllib.request.urlopen(
        req, timeout=30
    ) as r:  # the page with its token: a cookie for the rest
        cookie = r.headers["Set-Cookie"].split(";", 1)[0]
        assert r.status == 200 and "HttpOnly" in r.headers["Set-Cookie"]
    assert w.request("/static/app.js", headers={"Cookie": cookie})[0] == 200
    assert w.request("/api/jobs", headers={"X-Elsewhere-Token": w.token})[0] == 200


@pytest.mark.integration
def test_the_event_stream_tells_what_changed(web, tmp_path):
    w = web()
    job, gate = _job(tmp_path, "streamed", n=2)
    with urllib.request.urlopen(f"{w.base}/api/events?job={job.id}", timeout=30) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")

        def events():
            event = None
            for raw in stream:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event:
                    yield event, json.loads(line[6:])

        seen = events()
        first = dict(itertools.islice(seen, 2))
        assert first["jobs"]["jobs"][0]["name"] == "streamed" and first["job"]["state"] in (
            "queued",
            "running",
        )
        gate.touch()
        for event, data in seen:  # pushed as the job moves, until it ends
            if event == "job" and data["state"] == "failed":
                assert data["counts"] == {"finished": 1, "failed": 1}
                break


@pytest.mark.integration
def test_ew_web_serves_from_a_thread_until_stopped(ew_home, capsys):
    view = ew.web(port=0, read_only=True)
    try:
        assert capsys.readouterr().out.splitlines()[0] == view.url  # printed first, with its token
        base = view.url.split("/?", 1)[0]
        with urllib.request.urlopen(f"{base}/api/info", timeout=30) as r:
            assert json.loads(r.read())["read_only"] is True
        assert view.url in view._repr_html_()  # a notebook shows a link
    finally:
        view.stop()
    with pytest.raises(OSError):  # (URLError: connection refused)
        urllib.request.urlopen(f"{base}/api/info", timeout=5)


def test_without_starlette_the_error_names_the_extra():
    code = ("import sys; sys.modules['starlette'] = None; from elsewhere.api.cli import main; "
            "sys.exit(main(['web', '--port', '0']))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.returncode == 2 and "pip install 'elsewhere[web]'" in out.stderr, out.stderr
    assert out.stdout == ""
