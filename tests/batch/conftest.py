"""Fixtures for batch-scheduler tests against the real services of ci/services."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import services


@pytest.fixture
def slurm_info():
    info = services.slurm()
    if info is None:
        pytest.skip(services.why_no_slurm())
    return info
