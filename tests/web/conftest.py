"""Fixtures of the web view's tests: ``web(*args)`` starts ``elsewhere web`` on the test's home,
``browser`` is a real headless Chromium (skips, saying why, when it or Playwright is missing)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from webproc import CHROMIUM, CHROMIUM_ARGS, Web, start_web, stop_web

import services


@pytest.fixture
def web(ew_home) -> Iterator[Callable[..., Web]]:
    """A factory: ``web(*args)`` starts ``elsewhere web`` on this test's home; all are stopped
    afterwards."""
    started: list[Web] = []

    def make(*args: str) -> Web:
        w = start_web(*args)
        started.append(w)
        return w

    yield make
    for w in started:
        stop_web(w)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """Headless Chromium (Debian's) driven by Playwright; skips if either is missing."""
    if services.browser() is None:
        pytest.skip(services.why_no_browser())
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield b
        finally:
            b.close()
