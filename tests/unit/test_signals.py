"""How a process ended, in the same words from every backend (``elsewhere.util.signals``)."""

from __future__ import annotations

import signal
import sys

import pytest

from elsewhere.backends.batchstatus import _Survey
from elsewhere.hosts.local import LocalTransport
from elsewhere.hosts.transport import CommandFailed
from elsewhere.peer.children import describe_exit
from elsewhere.run.supervise import _death
from elsewhere.schedulers.status import NativeStatus
from elsewhere.util.signals import describe_returncode, describe_status, killed_by, signal_name
from elsewhere.util.states import TaskState


def test_a_signal_is_named_with_what_it_usually_means() -> None:
    assert killed_by(signal.SIGSEGV) == "killed by SIGSEGV (signal 11: a crash)"
    assert killed_by(signal.SIGABRT) == "killed by SIGABRT (signal 6: a crash)"
    assert killed_by(signal.SIGKILL) == "killed by SIGKILL (signal 9: out of memory, or killed by a user or a limit)"
    assert killed_by(signal.SIGTERM) == "killed by SIGTERM (signal 15)"
    assert killed_by(signal.SIGTERM, "qdel") == "killed by SIGTERM (signal 15: qdel)"
    assert killed_by(99) == "killed by signal 99"
    assert signal_name(99) == "signal 99" and signal_name(2) == "SIGINT"


def test_the_three_forms_of_a_signal_give_the_same_words() -> None:
    words = killed_by(11)
    assert describe_returncode(-11) == words
    assert describe_status(139) == f"exit code 139: {words}"
    assert describe_returncode(3) == describe_status(3) == "exit code 3"
    assert describe_status(128) == "exit code 128" and describe_status(193) == "exit code 193"


def test_each_backend_says_how_a_process_ended_in_those_words() -> None:
    words = killed_by(signal.SIGKILL)
    assert describe_exit(-9) == f"was {words}"  # a peer's task process
    assert _death(-9) == f"its process was {words}"  # a local worker under its watcher
    assert describe_exit(3) == "exited with code 3" and _death(3) == "its process exited with code 3"
    survey = _Survey()  # an array element a batch scheduler reports ended
    survey.add("SLURM", "7_1", NativeStatus("7_1", "FAILED", TaskState.FAILED, "", 139, "7", 1), [4], age_s=1.0)
    assert survey.lost[4] == f"SLURM 7_1 ended (FAILED, exit code 139: {killed_by(11)}) without a result"


def test_a_command_killed_by_a_signal_says_which() -> None:
    done = LocalTransport().run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
                                timeout=60, check=False)  # fmt: skip
    assert done.returncode == -signal.SIGSEGV
    with pytest.raises(CommandFailed, match=r"killed by SIGSEGV \(signal 11: a crash\)"):
        done.check()
