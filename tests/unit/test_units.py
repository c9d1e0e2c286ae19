"""One grammar for sizes and durations (docs/units.md): every accepted form, every rejected one
with a message that names the option, and the same meaning for every option that takes one:
``ew.slurm`` and the other batch clusters, ``ew.peers``, the peer worker's command line."""

from __future__ import annotations

import argparse
import datetime
import math
import re
from pathlib import Path

import pytest

import elsewhere as ew
from elsewhere.schedulers import ScriptContext, get_syntax
from elsewhere.util.errors import ConfigError
from elsewhere.util.units import (
    DURATION_FORMS,
    MIB,
    SIZE_FORMS,
    format_duration,
    format_size,
    parse_duration,
    parse_size,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "units.md"
KIB, GIB, TIB = 1 << 10, 1 << 30, 1 << 40

# -- sizes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, nbytes",
    [
        (512, 512 * MIB),  # a bare number is MiB, as SLURM's --mem=512
        (0.5, MIB // 2),
        (0, 0),
        ("512", 512 * MIB),
        ("1.5", 3 * MIB // 2),
        ("512M", 512 * MIB),
        ("512MB", 512 * MIB),
        ("512MiB", 512 * MIB),
        ("512Mi", 512 * MIB),
        ("512m", 512 * MIB),
        ("4G", 4 * GIB),
        ("4GB", 4 * GIB),  # binary, as schedulers read it
        ("4gb", 4 * GIB),
        ("1.5GiB", 3 * GIB // 2),
        (" 8.0 GiB ", 8 * GIB),
        (".5G", GIB // 2),
        ("800K", 800 * KIB),
        ("800kB", 800 * KIB),
        ("2T", 2 * TIB),
        ("1P", 1 << 50),
        ("4096B", 4096),
        ("100b", 100),
        ("1.5B", 2),  # a fraction of a byte rounds up
        (None, None),
    ],
)
def test_size_forms(value, nbytes):
    assert parse_size(value) == nbytes


@pytest.mark.parametrize(
    "value, message",
    [
        ("", "cannot read '' as a size"),
        ("lots", "cannot read 'lots' as a size"),
        ("4X", "cannot read '4X' as a size"),
        ("G", "cannot read"),
        ("4 G B", "cannot read"),
        ("1.2.3G", "cannot read"),
        ("-1G", "cannot read"),
        (-1, "finite number >= 0"),
        (math.inf, "finite number >= 0"),
        (math.nan, "finite number >= 0"),
        (True, "expected a size, got True (bool)"),
        ([4], "expected a size, got [4] (list)"),
    ],
)
def test_size_rejects_naming_the_option_and_the_forms(value, message):
    with pytest.raises(ConfigError) as err:
        parse_size(value, what="mem")
    text = str(err.value)
    assert text.startswith("mem: ") and message in text
    assert text.endswith("accepted forms: " + SIZE_FORMS)


# -- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, seconds",
    [
        (90, 90),  # a bare number is seconds
        (2.5, 2.5),
        (0, 0),
        ("90", 90),
        ("2.5", 2.5),
        ("90s", 90),
        ("90 sec", 90),
        ("90min", 5400),
        ("90 minutes", 5400),
        ("90m", 5400),
        ("1h30m", 5400),
        ("1h 30min", 5400),
        ("1.5h", 5400),
        ("2hrs", 7200),
        ("2d", 172800),
        ("1day", 86400),
        ("1w", 604800),
        ("500ms", 0.5),
        ("1d12h", 129600),
        ("01:00:00", 3600),
        ("36:00:00", 129600),  # hours may pass 24
        ("90:00", 5400),  # MM:SS
        ("1-12:00:00", 129600),  # SLURM's D-HH:MM:SS
        ("1-12:30", 131400),  # D-HH:MM
        ("2-12", 216000),  # D-HH
        ("0-00:00:45", 45),
        ("unlimited", math.inf),
        ("INF", math.inf),
        (math.inf, math.inf),
        (datetime.timedelta(minutes=90), 5400),
        (datetime.timedelta(milliseconds=1500), 1.5),
        (None, None),
    ],
)
def test_duration_forms(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    "value, message",
    [
        ("", "cannot read '' as a duration"),
        ("soon", "cannot read 'soon'"),
        ("1x", "cannot read '1x'"),
        ("1h30", "cannot read '1h30'"),  # 30 what? every number of several needs its unit
        ("1h and more", "cannot read"),
        ("-5", "cannot read"),
        ("1:2:3:4", "cannot read"),
        ("01:75:00", "field out of range"),
        ("10:61", "field out of range"),
        ("1-24:00:00", "field out of range"),
        (-5, ">= 0 seconds"),
        (math.nan, ">= 0 seconds"),
        (datetime.timedelta(seconds=-1), ">= 0 seconds"),
        (True, "expected a duration, got True (bool)"),
        ([90], "expected a duration, got [90] (list)"),
    ],
)
def test_duration_rejects_naming_the_option_and_the_forms(value, message):
    with pytest.raises(ConfigError) as err:
        parse_duration(value, what="walltime")
    text = str(err.value)
    assert text.startswith("walltime: ") and message in text
    assert text.endswith("accepted forms: " + DURATION_FORMS)


def test_formatted_values_read_back():
    for nbytes in (100, 512 * MIB, 8 * GIB, 3 * TIB):
        assert parse_size(format_size(nbytes)) == pytest.approx(nbytes, rel=0.05)
    for seconds in (30, 90, 5400, 129600, math.inf):
        assert parse_duration(format_duration(seconds)) == seconds
    assert format_size(8 * GIB) == "8.0 GiB" and format_duration(5400) == "1h30m"


# -- the same meaning for every option ---------------------------------------------------------


def _slurm(**settings):
    return ew.slurm(check=False, **settings)  # check=False: no sbatch needed, nothing submitted


def _worker(*argv: str):
    from elsewhere.api.peer_cli import add_peer_commands, worker_options

    parser = argparse.ArgumentParser()
    add_peer_commands(parser.add_subparsers(dest="command"))
    return worker_options(parser.parse_args(["peer", "worker", *argv]))


SIZES = [512, "512", "512M", "0.5G", "1.5GiB", "4G", "4096MB", 2048.5]


@pytest.mark.parametrize("value", SIZES)
def test_a_size_means_the_same_everywhere(ew_home, value):
    nbytes = parse_size(value)
    mb = -(-nbytes // MIB)
    assert _slurm(mem=value).mem_per_core_mb == mb
    assert _slurm(mem_per_core=value).mem_per_core_mb == mb
    assert ew.batch("sge", mem=value, check=False).mem_per_core_mb == mb
    assert ew.peers(memory=value).mem_bytes == nbytes
    assert _worker("--memavail", str(value)).memavail == nbytes


def test_a_bare_number_is_mib_for_every_size_option(ew_home):
    assert _slurm(mem=512).mem_per_core_mb == 512
    assert ew.peers(memory=512).mem_bytes == 512 * MIB
    assert _worker("--memavail", "512").memavail == 512 * MIB


DURATIONS = ["90min", "1h30m", "01:30:00", "0-01:30:00", "90:00", 5400, "5400", 5400.0]


@pytest.mark.parametrize("value", [*DURATIONS, datetime.timedelta(minutes=90)])
def test_a_duration_means_the_same_everywhere(ew_home, value):
    assert _slurm(walltime=value).walltime_s == 5400
    assert ew.batch("pbs", walltime=value, check=False).walltime_s == 5400
    assert ew.peers(time=value).time_s == 5400
    if not isinstance(value, datetime.timedelta):
        text = str(value)
        opts = _worker("--timavail", text, "--maxtime", text, "--maxidle", text, "--grace", text)
        assert (opts.timavail, opts.maxtime, opts.maxidle, opts.orphan_s) == (5400,) * 4


def test_the_documented_batch_example_works(ew_home):
    # backends/batch.py's docstring gives walltime="90min"; it was refused before
    cl = _slurm(partition="debug", cores_per_task=4, walltime="90min", mem="4G")
    assert cl.walltime_s == 5400 and cl.mem_per_core_mb == 1024  # mem is per task: 4 cores share it


@pytest.mark.parametrize(
    "name, lines",
    [
        ("slurm", ["#SBATCH --time=01:30:00", "#SBATCH --mem-per-cpu=1536M"]),
        ("sge", ["#$ -l h_rt=01:30:00", "#$ -l h_vmem=1536M"]),
        ("openpbs", ["#PBS -l walltime=01:30:00", ":mem=1536mb"]),
        ("lsf", ["#BSUB -W 1:30", '#BSUB -R "rusage[mem=1536MB]"']),
        ("htcondor", ["request_memory = 1536", "> 5400)"]),
        ("flux", ["-t 5400s"]),
    ],
)
def test_each_scheduler_writes_the_one_value_in_its_own_syntax(ew_home, name, lines):
    cl = _slurm(walltime="90min", mem="1.5G")
    syntax = get_syntax(name)
    ctx = ScriptContext(job_name="units", run_line="python -m elsewhere.worker", log_dir="/tmp/l",
                        walltime_s=cl.walltime_s, mem_per_core_mb=cl.mem_per_core_mb)  # fmt: skip
    script = syntax.render_script(ctx)
    for line in lines:
        assert line in script, (name, line, script)


# -- errors name the option --------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, option",
    [
        (lambda: _slurm(walltime="soon"), "walltime"),
        (lambda: _slurm(walltime="1h30"), "walltime"),
        (lambda: _slurm(mem="lots"), "mem"),
        (lambda: _slurm(mem_per_core="4X"), "mem_per_core"),
        (lambda: ew.batch("lsf", walltime=True, check=False), "walltime"),
        (lambda: ew.peers(memory="lots"), "memory"),
        (lambda: ew.peers(time="soon"), "time"),
        (lambda: _worker("--memavail", "lots"), "--memavail"),
        (lambda: _worker("--timavail", "soon"), "--timavail"),
        (lambda: _worker("--maxtime", "8 hours please"), "--maxtime"),
        (lambda: _worker("--maxidle", "1x"), "--maxidle"),
        (lambda: _worker("--grace", "-1"), "--grace"),
    ],
)
def test_a_bad_value_names_its_option_and_the_accepted_forms(ew_home, make, option):
    with pytest.raises(ConfigError) as err:
        make()
    text = str(err.value)
    assert text.startswith(f"{option}: ") and "accepted forms: " in text
    assert "'4G'" in text or "'90min'" in text


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"walltime": 0}, "walltime: a time limit must be above 0"),
        ({"walltime": "unlimited"}, "walltime: a time limit must be finite"),
        ({"mem": 0}, "mem: memory must be above 0"),
        ({"mem": "0G"}, "mem: memory must be above 0"),
    ],
)
def test_batch_limits_must_be_above_zero_and_finite(ew_home, settings, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        _slurm(**settings)


def test_local_cluster_refuses_an_unknown_option_with_a_config_error(ew_home):
    with pytest.raises(ConfigError, match=r"memory='4G'.*local cluster"):
        ew.local(memory="4G")


def test_worker_options_hold_bytes(ew_home):
    from elsewhere.peer.options import WorkerOptions

    assert WorkerOptions(memavail=8 * GIB).memavail == 8 * GIB
    with pytest.raises(ConfigError, match="memavail"):
        WorkerOptions(memavail="8G")  # type: ignore[arg-type]


# -- the documentation says what the code does -------------------------------------------------


def _doc_forms(kind: str) -> list[str]:
    """The forms in the first column of docs/units.md's table of ``kind`` (size or duration)."""
    text = DOC.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith(f"| {kind} |")]
    assert rows, f"docs/units.md has no '| {kind} |' rows"
    return [f.strip('"') for row in rows for f in re.findall(r"`([^`]+)`", row.split("|")[2])]


def test_every_size_in_the_documentation_is_accepted():
    forms = _doc_forms("size")
    assert "512" in forms and "1.5GiB" in forms
    for form in forms:
        assert parse_size(form) is not None, form


def test_every_duration_in_the_documentation_is_accepted():
    forms = _doc_forms("duration")
    assert "1-12:00:00" in forms and "90min" in forms
    for form in forms:
        assert parse_duration(form) is not None, form
