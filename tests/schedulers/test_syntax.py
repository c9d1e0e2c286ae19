"""The shared protocol: ScriptContext, helpers, registry, templates of every scheduler."""

from __future__ import annotations

import dataclasses
import datetime
import re
import shutil
import subprocess

import pytest

import elsewhere.schedulers as schedulers
from elsewhere.schedulers import (
    BatchSyntax,
    SchedulerSyntax,
    ScriptContext,
    compress_indices,
    expand_indices,
    format_walltime,
    format_walltime_hm,
    get_syntax,
    parse_memory_mb,
    parse_walltime,
    split_array_first,
)
from elsewhere.schedulers.syntax import parse_int
from elsewhere.util.errors import ConfigError

ALL = ["slurm", "sge", "openpbs", "torque", "slurm-torque", "lsf", "htcondor", "flux"]
PREFIX = {
    "slurm": "#SBATCH",
    "sge": "#$",
    "openpbs": "#PBS",
    "torque": "#PBS",
    "slurm-torque": "#PBS",
    "lsf": "#BSUB",
}


def ctx_for(syntax: SchedulerSyntax, **kw) -> ScriptContext:
    base = syntax.array_index_base
    fields = dict(
        job_name="fit",
        run_line="/opt/py/bin/python -m elsewhere.worker /jobs/fit",
        log_dir="/home/u/jobs/fit/logs",
        array_size=5,
        array_first=base,
        max_running=2,
        cores_per_task=2,
        mem_per_core_mb=1500,
        walltime_s=5400,
        queue="short",
        account="proj1",
        env={"ELSEWHERE_JOB": "/jobs/fit", "QUOTED": "a b'c"},
        env_setup=["module load python/3.11"],
        extra_directives=[],
    )
    fields.update(kw)
    return ScriptContext(**fields)


# -- ScriptContext ---------------------------------------------------------------------


def test_context_fills_array_last_and_walltime():
    ctx = ScriptContext(
        job_name="a", run_line="x", log_dir="/l", array_size=4, array_first=1, walltime_s=93784
    )
    assert ctx.array_last == 4
    assert ctx.walltime == "26:03:04"
    assert ctx.fields()["walltime"] == "26:03:04"


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"job_name": "has space"}, "job_name"),
        ({"job_name": "a[1]"}, "job_name"),
        ({"job_name": "x" * 65}, "64"),
        ({"run_line": "a\nb"}, "run_line"),
        ({"log_dir": 'a"b'}, "log_dir"),
        ({"array_size": 0}, "array_size"),
        ({"array_size": 3, "array_last": 7}, "array_last"),
        ({"max_running": 0}, "max_running"),
        ({"cores_per_task": True}, "cores_per_task"),
        ({"walltime_s": -1}, "walltime_s"),
        ({"queue": "two words"}, "queue"),
        ({"env": {"1BAD": "x"}}, "1BAD"),
        ({"env": {"OK": 3}}, "OK"),
        ({"extra_directives": ["a\nb"]}, "single lines"),
        ({"communicating": True, "array_size": 2}, "communicating"),
    ],
)
def test_context_rejects_bad_values_naming_them(kw, word):
    fields = dict(job_name="a", run_line="x", log_dir="/l")
    fields.update(kw)
    with pytest.raises(ConfigError, match=re.escape(word)):
        ScriptContext(**fields)


def test_safe_name_makes_names_every_scheduler_takes():
    assert ScriptContext.safe_name("my fit [v2]/x") == "my_fit__v2__x"
    assert ScriptContext.safe_name("_x") == "x"
    assert ScriptContext.safe_name("!!!") == "job"
    name = ScriptContext.safe_name("a" * 100)
    ScriptContext(job_name=name, run_line="x", log_dir="/l")


# -- helpers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, seconds",
    [
        (90, 90),
        (1.2, 2),
        ("45", 45),
        ("01:30:00", 5400),
        ("90:00", 5400),
        ("1-00:00:00", 86400),
        ("1-12:00:00", 129600),
        ("2-12", 2 * 86400 + 12 * 3600),
        ("1h30m", 5400),
        ("90m", 5400),
        ("90min", 5400),
        ("2d", 172800),
        ("0.5s", 1),
        (datetime.timedelta(hours=1), 3600),
    ],
)
def test_parse_walltime(value, seconds):
    assert parse_walltime(value) == seconds


@pytest.mark.parametrize(
    "value, message",
    [
        ("", "cannot read"),
        ("soon", "cannot read"),
        ("1:2:3:4", "cannot read"),
        ("1x", "cannot read"),
        (0, "above 0"),
        (-5, ">= 0"),
        ("unlimited", "finite"),
        (None, "expected a duration"),
    ],
)
def test_parse_walltime_rejects_naming_the_option(value, message):
    with pytest.raises(ConfigError, match=r"^walltime: .*" + re.escape(message)):
        parse_walltime(value)
    with pytest.raises(ConfigError, match=r"^time_limit: "):
        parse_walltime(value, what="time_limit")


def test_format_walltime():
    assert format_walltime(0) == "00:00:00"
    assert format_walltime(3661) == "01:01:01"
    assert format_walltime(100 * 3600) == "100:00:00"
    assert [format_walltime_hm(s) for s in (60, 61, 5400, 100 * 3600)] == [
        "0:01",
        "0:02",
        "1:30",
        "100:00",
    ]
    with pytest.raises(ConfigError, match="walltime"):
        format_walltime(-1)


@pytest.mark.parametrize(
    "value, mb",
    [
        (512, 512),
        ("512", 512),
        (0.5, 1),
        ("512M", 512),
        ("4G", 4096),
        ("4GB", 4096),
        ("4GiB", 4096),
        ("1.5g", 1536),
        ("2T", 2097152),
        ("1024K", 1),
        ("1K", 1),
        ("1048577B", 2),
    ],
)
def test_parse_memory_mb(value, mb):
    assert parse_memory_mb(value) == mb


@pytest.mark.parametrize("value", ["", "lots", "4X", 0, "0G", -1, True])
def test_parse_memory_rejects_naming_the_option(value):
    with pytest.raises(ConfigError, match=r"^mem: "):
        parse_memory_mb(value)
    with pytest.raises(ConfigError, match=r"^mem_per_core: "):
        parse_memory_mb(value, what="mem_per_core")


def test_the_split_modules_names_still_come_from_syntax():
    # scheduler plugins import these from elsewhere.schedulers.syntax
    from elsewhere.schedulers import context, indices, resources, status, syntax

    assert syntax.ScriptContext is context.ScriptContext
    assert syntax.NativeStatus is status.NativeStatus
    assert syntax.protocol_error is status.protocol_error and syntax.parse_int is status.parse_int
    assert syntax.expand_indices is indices.expand_indices
    assert syntax.parse_walltime is resources.parse_walltime
    assert set(syntax.__all__) <= set(dir(syntax))


@pytest.mark.parametrize(
    "spec, indices",
    [
        ("5", [5]),
        ("1-4", [1, 2, 3, 4]),
        ("1-10:3", [1, 4, 7, 10]),
        ("[5-9%2]", [5, 6, 7, 8, 9]),
        ("3-5%2", [3, 4, 5]),
        ("1,3,5-6", [1, 3, 5, 6]),
        ("4-6:1", [4, 5, 6]),
    ],
)
def test_expand_indices(spec, indices):
    assert expand_indices(spec) == indices


@pytest.mark.parametrize("spec", ["", "a-b", "5-1", "1-3:0", "[1-"])
def test_expand_indices_rejects(spec):
    with pytest.raises(ValueError):
        expand_indices(spec)


def test_compress_indices_round_trips():
    assert compress_indices([9, 1, 2, 3, 7, 10]) == "1-3,7,9-10"
    assert expand_indices(compress_indices([0, 4, 5, 6])) == [0, 4, 5, 6]


def test_split_array_first_and_parse_int():
    assert split_array_first("123@5") == ("123", 5)
    assert split_array_first("123") == ("123", 0)
    assert split_array_first("a@b") == ("a@b", 0)
    assert [parse_int(x) for x in ("3", " -2 ", "4.0", "-", "undefined", "")] == [
        3,
        -2,
        4,
        None,
        None,
        None,
    ]


# -- registry ----------------------------------------------------------------------------------


def test_all_is_complete():
    import types

    public = {n for n in dir(schedulers) if not n.startswith("_")}
    # its submodules show as attributes once imported (by any test before this one): not names
    modules = {n for n in public if isinstance(getattr(schedulers, n), types.ModuleType)}
    helpers = {
        "annotations",
        "entry_points",
        "MappingProxyType",
        "Any",
        "Callable",
        "Mapping",
        "ConfigError",
    }
    assert public - modules - helpers == set(schedulers.__all__)


@pytest.mark.parametrize("name", ALL)
def test_every_builtin_implements_the_protocol(name):
    syntax = get_syntax(name)
    assert isinstance(syntax, SchedulerSyntax)
    assert isinstance(syntax, BatchSyntax)
    assert syntax.array_index_var and syntax.submit_command and syntax.states
    assert get_syntax(name) == syntax and hash(get_syntax(name)) == hash(syntax)
    assert name.split("-")[0] in repr(syntax).lower() or type(syntax).__name__ in repr(syntax)


def test_registry_config_and_errors():
    assert get_syntax("torque").variant == "torque"
    assert get_syntax("pbs", variant="slurm-torque").array_index_var == "PBS_ARRAYID"
    assert get_syntax("SLURM", accounting="jobcomp").accounting == "jobcomp"
    assert set(ALL) <= set(schedulers.available())
    with pytest.raises(ConfigError, match="unknown scheduler 'nope'"):
        get_syntax("nope")
    with pytest.raises(ConfigError, match="bad configuration"):
        get_syntax("lsf", colour="blue")
    with pytest.raises(ConfigError, match="accounting"):
        get_syntax("slurm", accounting="maybe")
    with pytest.raises(ConfigError, match="variant"):
        get_syntax("pbs", variant="pbspro9")


# -- templates ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_template_renders_a_bash_script_with_directives_first(name):
    syntax = get_syntax(name)
    ctx = ctx_for(
        syntax, extra_directives=["--custom-thing"] if name != "htcondor" else ["+Custom = 1"]
    )
    text = syntax.render_script(ctx)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "{{" not in text.replace("{{id.dec}}", "") and "{%" not in text
    assert f"exec {ctx.run_line}" in text
    assert "export QUOTED='a b'\"'\"'c'" in text
    assert (
        text.index("export ELSEWHERE_JOB")
        < text.index("module load python/3.11")
        < text.index("exec " + ctx.run_line)
    )
    assert "elsewhere: job" in text  # the header the log starts with
    if name in PREFIX:
        directives = [ln for ln in lines[1:] if ln.startswith(PREFIX[name])]
        first_command = next(
            i for i, ln in enumerate(lines[1:], 1) if ln and not ln.startswith("#")
        )
        assert directives and all(lines.index(d) < first_command for d in directives)
        assert f"{PREFIX[name]} --custom-thing" in lines


@pytest.mark.parametrize("name", ALL)
def test_template_is_valid_bash(name, tmp_path):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    syntax = get_syntax(name)
    for ctx in (
        ctx_for(syntax),
        ctx_for(
            syntax,
            array_size=1,
            max_running=None,
            mem_per_core_mb=None,
            walltime_s=None,
            queue=None,
            account=None,
            env={},
            env_setup=[],
        ),
    ):
        path = tmp_path / f"{name}.sh"
        path.write_text(syntax.render_script(ctx))
        result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", [n for n in ALL if n != "htcondor"])
def test_communicating_template_asks_for_ranks_and_uses_a_launcher(name):
    syntax = get_syntax(name)
    ctx = ctx_for(syntax, array_size=1, communicating=True, ranks=6, max_running=None)
    text = syntax.render_script(ctx)
    assert "6" in text
    assert f"exec {syntax.mpi_launcher}" in text
    launch = next(ln for ln in text.splitlines() if ln.startswith(f"exec {syntax.mpi_launcher}"))
    assert name in ("slurm", "lsf") or " 6 " in launch
    assert "--array" not in text and "#$ -t" not in text and "-J 0-" not in text


def test_htcondor_refuses_communicating_jobs_with_the_builtin_template():
    syntax = get_syntax("htcondor")
    with pytest.raises(ConfigError, match="parallel universe"):
        syntax.render_script(
            ctx_for(syntax, array_size=1, communicating=True, ranks=2, max_running=None)
        )


def test_missing_template_field_is_named():
    syntax = get_syntax("slurm")
    with pytest.raises(ConfigError, match="'partition_name' is undefined"):
        syntax.render_script(
            ctx_for(syntax), template="#!/bin/bash\n#SBATCH -p {{ partition_name }}\n"
        )


def test_additional_properties_reach_the_template():
    syntax = get_syntax("sge")
    ctx = ctx_for(syntax, additional={"pe": "threads", "mem_resource": "mem_free"})
    text = syntax.render_script(ctx)
    assert "#$ -pe threads 2" in text and "#$ -l mem_free=1500M" in text
    custom = "#!/bin/bash\n#$ -l site={{ additional.site }}\n"
    assert "#$ -l site=north" in syntax.render_script(
        dataclasses.replace(ctx, additional={"site": "north"}), custom
    )


def test_template_syntax_error_and_missing_shebang():
    syntax = get_syntax("lsf")
    ctx = ctx_for(syntax)
    with pytest.raises(ConfigError, match="line 2"):
        syntax.render_script(ctx, template="#!/bin/bash\n{% if %}\n")
    with pytest.raises(ConfigError, match="#!"):
        syntax.render_script(ctx, template="echo no shebang\n")


@pytest.mark.parametrize("name, first", [("sge", 1), ("lsf", 1), ("slurm", 0)])
def test_array_first_left_unset_is_the_schedulers_base(name, first):
    syntax = get_syntax(name)
    ctx = ScriptContext(job_name="j", run_line="r", log_dir="/l", array_size=3)
    assert ctx.array_first is None and ctx.array_last is None
    resolved = ctx.with_base(syntax.array_index_base)
    assert (resolved.array_first, resolved.array_last) == (first, first + 2)
    assert f"{first}-{first + 2}" in syntax.render_script(ctx)
    with pytest.raises(ConfigError, match="needs array_first"):
        ScriptContext(job_name="j", run_line="r", log_dir="/l", array_last=4)


def test_index_below_the_schedulers_base_is_refused():
    syntax = get_syntax("sge")
    with pytest.raises(ConfigError, match="below the scheduler's first index 1"):
        syntax.render_script(ctx_for(syntax, array_first=0))


def test_load_template_reads_a_file_and_names_a_missing_one(tmp_path):
    path = tmp_path / "t.j2"
    path.write_text("#!/bin/bash\necho {{ job_name }}\n")
    syntax = get_syntax("slurm")
    assert (
        syntax.render_script(ctx_for(syntax), schedulers.load_template(str(path)))
        == "#!/bin/bash\necho fit\n"
    )
    with pytest.raises(ConfigError, match="nothere"):
        schedulers.load_template(str(tmp_path / "nothere"))
