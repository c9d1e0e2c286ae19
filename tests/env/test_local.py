"""python= as a command line on local workers: a container runtime's wrapper, shell setup, podman."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

import elsewhere as ew

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env_wrappers import inside, podman_command, python_prefixes

pytestmark = pytest.mark.timeout(120)


def test_workers_run_through_the_wrapper_with_every_word_as_given(
    ew_home, fake_container, odd_image
):
    cl = ew.local(2, python=fake_container.command(odd_image), idle_timeout_s=1)
    try:
        assert ew.map(inside, range(4), on=cl) == [(x, odd_image, None) for x in range(4)]
    finally:
        cl.shutdown()
    runs = fake_container.runs()
    assert runs, "the wrapper never ran"
    for _pid, image, command in runs:
        assert image == odd_image
        assert command.startswith(f"{sys.executable} -c ")  # the worker, after the image


def test_setup_before_and_runs_first_and_a_list_is_argv_as_it_is(ew_home, fake_container):
    setup = f"export EW_SETUP_MARK='set up; twice' && {fake_container.command('img.sif')}"
    words = [str(fake_container.path), "exec", "list image.sif", sys.executable]
    for python, image, mark in [
        (setup, "img.sif", "set up; twice"),
        (words, "list image.sif", None),
    ]:
        cl = ew.local(1, python=python, idle_timeout_s=1)
        try:
            assert ew.map(inside, [1], on=cl) == [(1, image, mark)]
        finally:
            cl.shutdown()
    assert {image for _, image, _ in fake_container.runs()} == {"img.sif", "list image.sif"}


def test_bad_python_is_a_config_error_naming_the_option(ew_home, tmp_path):
    for bad in ["", "'unclosed", [], "module load x;", "a | python3"]:
        with pytest.raises(ew.ConfigError, match="python="):
            ew.local(python=bad)
    with pytest.raises(ew.ConfigError, match="no-such-runtime"):
        ew.local(python="no-such-runtime exec img python3")


def test_a_path_with_spaces_is_still_one_interpreter(ew_home, tmp_path):
    path = tmp_path / "my python" / "python3"  # an interpreter that is a script, as some are
    path.parent.mkdir()
    path.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    path.chmod(0o755)
    cl = ew.local(1, python=str(path), idle_timeout_s=1)
    try:
        assert cl.command.words == (str(path),)
        assert ew.map(abs, [-3], on=cl) == [3]
    finally:
        cl.shutdown()


def test_podman_runs_the_workers(ew_home, podman, tmp_path):
    """A real container: podman from Debian's packages, rootfs from the host's /usr."""
    python = podman_command(podman, [*python_prefixes(), str(tmp_path)])
    cl = ew.local(1, python=python, idle_timeout_s=1)
    try:
        got = ew.map(_container_marker, [0], on=cl, timeout=90)
    finally:
        cl.shutdown()
    assert got == ["podman"], shlex.join(python)


def _container_marker(_):
    return os.environ.get("EW_CONTAINER")  # set by podman's -e, not in this process


def test_doctor_checks_the_interpreter_through_the_same_command_line(
    ew_home, fake_container, odd_image
):
    from elsewhere.api.doctor import diagnose

    checks = {c.name: c for c in diagnose("local", python=fake_container.command(odd_image))}
    assert checks["python"].ok and checks["elsewhere"].ok, checks
    assert [(image, cmd.split()[:2]) for _, image, cmd in fake_container.runs()] == [
        (odd_image, [sys.executable, "-c"])
    ]
    failed = {c.name: c for c in diagnose("local", python=f"false && {sys.executable}")}
    assert not failed["python"].ok and "false && " in failed["python"].detail, failed
