"""The public surface: every name in __all__ resolves; the binding names exist."""

from __future__ import annotations

import subprocess
import sys

import elsewhere as ew

BINDING = ["map", "submit", "create_job", "Job", "TaskError", "jobs", "recover", "Executor", "local", "task"]
JOB_METHODS = ["add_task", "submit", "check", "wait", "results", "get", "log", "cancel", "purge",
               "state", "name", "id", "tasks"]


def test_all_names_resolve():
    for name in ew.__all__:
        assert getattr(ew, name) is not None, name
    for name in BINDING:
        assert name in ew.__all__
    for attr in JOB_METHODS:
        assert hasattr(ew.Job, attr), attr


def test_worker_import_is_light():
    code = "import sys, elsewhere.worker; print(sorted(m for m in ('rich','jinja2','psutil','sqlite3','platformdirs') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
