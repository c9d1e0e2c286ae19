"""The progress bar: on terminals only, and only for waits longer than a moment."""

from __future__ import annotations

import io
import logging

import pytest

from elsewhere.util import progress
from elsewhere.util.states import TaskState


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def counts(done, running=0, failed=0):
    c = dict.fromkeys(TaskState, 0)
    c[TaskState.FINISHED] = done
    c[TaskState.RUNNING] = running
    c[TaskState.FAILED] = failed
    return c


def test_bar_on_a_terminal_after_the_delay(monkeypatch):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    out = FakeTTY()
    bar = progress.Progress("myjob", stream=out)
    bar.update(counts(3, running=2, failed=1), 10)
    bar.close()
    text = out.getvalue()
    assert "myjob" in text and "4/10" in text and "1 failed" in text  # done = finished + failed


def test_no_bar_in_a_pipe_or_before_the_delay(monkeypatch):
    pipe = io.StringIO()
    bar = progress.Progress("myjob", stream=pipe)
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    bar.update(counts(1), 2)
    bar.close()
    assert pipe.getvalue() == ""
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 60.0)
    tty = FakeTTY()
    bar = progress.Progress("myjob", stream=tty)
    bar.update(counts(1), 2)
    bar.close()
    assert tty.getvalue() == ""
    off = progress.Progress("myjob", stream=FakeTTY(), enabled=False)
    assert not off.enabled


def test_a_note_shows_on_a_line_of_its_own(monkeypatch):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    out = FakeTTY()
    bar = progress.Progress("myjob", stream=out)
    bar.update(counts(0), 3, "waiting for peers: none seen yet [port 17700]")
    bar.close()
    lines = out.getvalue().splitlines()
    assert any("0/3" in line for line in lines)
    note = [line for line in lines if "waiting for peers" in line]
    assert note and "0/3" not in note[-1]  # not squeezed into the bar's row
    assert "[port 17700]" in note[-1]  # shown as text, not read as markup


def test_off_a_terminal_a_lasting_note_is_logged_once(monkeypatch, caplog: pytest.LogCaptureFixture):
    monkeypatch.setattr(progress, "NOTE_AFTER_S", 0.0)
    bar = progress.Progress("myjob", stream=io.StringIO())
    with caplog.at_level(logging.WARNING, logger="elsewhere"):
        for n in (3, 2, 2):  # the same reason while the count changes
            bar.update(counts(0), 3, f"{n} pending: Resources")
        bar.update(counts(0), 3, "")
        bar.update(counts(0), 3, "2 pending: Priority")
    said = [r.getMessage() for r in caplog.records]
    assert said == ["job myjob: 3 pending: Resources", "job myjob: 2 pending: Priority"]


def test_off_a_terminal_a_passing_note_is_not_logged(monkeypatch, caplog: pytest.LogCaptureFixture):
    monkeypatch.setattr(progress, "NOTE_AFTER_S", 60.0)
    bar = progress.Progress("myjob", stream=io.StringIO())
    with caplog.at_level(logging.WARNING, logger="elsewhere"):
        bar.update(counts(0), 3, "waiting for peers")
        bar.update(counts(0), 3, "waiting for peers")
    assert caplog.records == []
