"""Shared fixtures for the scheduler tests: the captured outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
try:
    import elsewhere.schedulers  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(SRC))

CAPTURED = Path(__file__).resolve().parent / "captured"
FAKES = Path(__file__).resolve().parents[1] / "fakes"
if str(FAKES) not in sys.path:  # scheduler_contract.py: the submit/status/cancel path
    sys.path.insert(0, str(FAKES))


@pytest.fixture
def captured():
    """``captured("slurm/squeue_array_mixed.txt")`` -> the file's text."""

    def read(name: str) -> str:
        return (CAPTURED / name).read_text(encoding="utf-8")

    return read
