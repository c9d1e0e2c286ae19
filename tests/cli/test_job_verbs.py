"""The job verbs from a shell, on real jobs of local workers (``jobs`` in conftest.py: job
'fits', whose task 1 raised, and job 'slow', running): a failed task's remote traceback, errors
that speak of shell commands, exit codes that tell outcomes apart, ``--json`` on every read."""

from __future__ import annotations

import pytest

from cli.conftest import one_line, strict_json

pytestmark = pytest.mark.timeout(180)


def test_errors_prints_the_remote_traceback_of_a_failed_task(jobs):
    every = jobs("errors", "fits")
    assert every.returncode == 0, every.stderr
    lines = every.stdout.splitlines()
    assert lines[0].startswith("==> task 1 of job 'fits': ValueError on ") and "seed" in lines[0]
    assert lines[1] == "Traceback (most recent call last):"  # as the task raised it, where it ran
    assert lines[-1] == "ValueError: bad input 1"
    assert "task 0" not in every.stdout and "task 2" not in every.stdout  # they finished

    one = jobs("errors", "fits", "1", "--json")
    (record,) = strict_json(one.stdout)
    assert (
        record["task"] == 1
        and record["type"] == "ValueError"
        and record["message"] == "bad input 1"
    )
    assert record["reason"] == "error" and isinstance(record["seed"], int) and record["host"]
    assert record["traceback"].startswith("Traceback (most recent call last):")
    assert record["traceback"].rstrip().endswith("ValueError: bad input 1")

    fine = jobs("errors", "fits", "0")
    assert (
        fine.returncode == 0 and "task 0 of job 'fits' has no error: it is finished" in fine.stdout
    )
    one_line(jobs("errors", "fits", "9"), 2, "no task 9", "0 to 2")  # not a traceback


def test_status_and_results_point_to_the_errors_command(jobs):
    status = jobs("status", "fits")
    assert status.returncode == 0 and "failed 1" in status.stdout
    assert "`elsewhere errors fits`" in status.stdout
    results = jobs("results", "fits")
    assert "1: ValueError: bad input 1" in results.stdout
    assert "`elsewhere errors fits`" in results.stdout


def test_results_of_a_running_job_speaks_of_shell_commands(jobs):
    line = one_line(jobs("results", "slow"), 1, "without a result yet",
                    "`elsewhere wait slow`", "`elsewhere results slow --partial`")  # fmt: skip
    assert "job.wait()" not in line and "partial=True" not in line
    partial = jobs("results", "slow", "--partial", "--json")
    assert strict_json(partial.stdout) == [{"task": 0, "value": None}]


def test_exit_codes_tell_a_timeout_from_a_failed_job_and_from_no_job(jobs):
    one_line(jobs("wait", "slow", "--timeout", "0.2", "--no-progress"), 124, "goes on running")
    failed = jobs("wait", "fits", "--json")  # and its state, as JSON
    assert failed.returncode == 1 and strict_json(failed.stdout)["counts"]["failed"] == 1
    nope = one_line(jobs("status", "nope"), 2, "no job named 'nope'", "`elsewhere jobs`")
    assert "ew.jobs()" not in nope  # the shell's words, not Python's
    one_line(jobs("logs", "fits", "99"), 2, "job 'fits' has no task 99: its tasks are 0 to 2")


def test_every_read_has_strict_json_with_nested_objects(jobs):
    rows = strict_json(jobs("jobs", "--json").stdout)
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == {"fits", "slow"}
    assert by_name["fits"]["cluster"]["kind"] == "local"  # an object, not JSON text in JSON
    assert by_name["fits"]["counts"] == {"finished": 2, "failed": 1}

    # (status, results and errors --json: in the tests above and in tests/local/test_cli.py)
    logs = strict_json(jobs("logs", "fits", "--json").stdout)
    assert logs == [{"task": i, "log": f"fitting {i}\n"} for i in range(3)]
    templates = strict_json(jobs("template", "list", "--json").stdout)
    assert {
        "name": "slurm",
        "source": "built in",
        "path": None,
        "replaces_builtin": False,
    } in templates
    checks = strict_json(jobs("doctor", "local", "--json").stdout)
    assert {c["name"] for c in checks} >= {"python", "cores", "storage"}
    assert all(set(c) == {"name", "ok", "detail", "fix"} for c in checks)
