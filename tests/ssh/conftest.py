"""Fixtures of the ssh tests: the loopback sshd of ci/services/sshd.sh."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import services


@pytest.fixture
def sshd():
    """The loopback sshd (its address, user and key); skips with the reason when it is not there."""
    info = services.ssh()
    if info is None:
        pytest.skip(services.why_no_ssh())
    return info
