"""The progress bar: on terminals only, and only for waits longer than a moment."""

from __future__ import annotations

import io

from elsewhere import progress
from elsewhere.states import TaskState


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
