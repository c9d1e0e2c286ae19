"""Helpers of the web view's tests: ``elsewhere web`` as a real process on a free loopback port,
plain HTTP requests to it, and the browser's settings (Debian's Chromium, driven by Playwright).

Imported by name (conftest puts this folder on sys.path). Every wait has a timeout; every
process is stopped by its own pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import services
from peer.peer_procs import free_port as free_port  # (the same ports as the peer tests)
from peer.peer_procs import wait_until as wait_until

CHROMIUM = services.CHROMIUM
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
SRC = str(Path(__file__).resolve().parents[2] / "src")
#: Where the screenshots go, when ELSEWHERE_WEB_SCREENSHOTS=1 (docs/web.md shows them).
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"


@dataclass
class Web:
    """A running ``elsewhere web``: its first line of output (the URL with the token)."""

    proc: subprocess.Popen[str]
    url: str
    log: Path

    def output(self) -> str:
        """What the server printed so far."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def base(self) -> str:
        return self.url.split("/?", 1)[0]

    @property
    def token(self) -> str:
        return self.url.split("token=", 1)[1]

    def request(self, path: str, *, method: str = "GET", token: str | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, str]:  # fmt: skip
        """(status, body) of a plain HTTP request (``token``: sent in the action header)."""
        h = dict(headers or {})
        if token is not None:
            h["X-Elsewhere-Token"] = token
        req = urllib.request.Request(
            self.base + path, method=method, headers=h, data=b"" if method == "POST" else None
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


def start_web(*args: str, timeout: float = 30.0) -> Web:
    """Start ``elsewhere web --port 0 ARGS`` (the test's ELSEWHERE_HOME) and read its URL line
    (its output goes to a file, so that a chatty server never blocks on a full pipe)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log = tempfile.NamedTemporaryFile("w+", prefix="elsewhere-web-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "elsewhere", "web", "--port", "0", *args], stdout=log,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)  # fmt: skip
    web = Web(proc, "", Path(log.name))
    log.close()
    wait_until(
        lambda: "\n" in web.output() or proc.poll() is not None,
        timeout,
        "elsewhere web to print its URL",
    )
    line = web.output().partition("\n")[0].strip()
    if not line.startswith("http://"):
        stop_web(web)
        raise AssertionError(
            f"elsewhere web did not print its URL first; its output:\n{web.output()}"
        )
    web.url = line
    return web


def stop_web(web: Web) -> None:
    """Ctrl-C (SIGINT) the server, as a user would; SIGKILL if it has not ended in 10 s."""
    proc = web.proc
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    web.log.unlink(missing_ok=True)


def screenshots() -> bool:
    """Whether this run saves the views into docs/img (ELSEWHERE_WEB_SCREENSHOTS=1)."""
    return os.environ.get("ELSEWHERE_WEB_SCREENSHOTS") == "1"
