"""The pure part of a batch scheduler: states, script, commands and parsers.

A batch scheduler is described to elsewhere by a small class with no state
besides its configuration. It renders the job script from a jinja2 template,
builds the argv of the submit / status / accounting / cancel commands, and
parses what those commands print. It never runs anything: the one place that
runs commands (locally or on a login node over ssh) is the shared cluster base,
which calls these methods::

    ScriptContext --render_script--> job script text
    script path   --build_submit---> argv --(base runs it)--> stdout --parse_submit--> job id
    job ids       --build_status---> argv --(base runs it)--> stdout --parse_status--> {native_id: NativeStatus}
    job ids       --build_accounting-> argv ...                --parse_accounting-> {native_id: NativeStatus}
    native ids    --build_cancel---> argv --(base runs it)--> returncode, stderr --cancel_ok--> bool

Because every method is pure, each scheduler is tested on text captured from
the real tool (``tests/schedulers/captured``), and the same parsers read the
output of the stateful fakes in ``tests/fakes``.

This module holds what all schedulers share: :class:`NativeStatus`,
:class:`ScriptContext`, the :class:`SchedulerSyntax` protocol, the
:class:`BatchSyntax` base class that implements the common parts, and helpers
for walltimes, memory sizes and index ranges.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib.resources
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import jinja2

from elsewhere.util.errors import ConfigError, SchedulerError
from elsewhere.util.states import TaskState

__all__ = [
    "BatchSyntax",
    "NativeStatus",
    "SchedulerSyntax",
    "ScriptContext",
    "compress_indices",
    "expand_indices",
    "format_walltime",
    "load_template",
    "parse_memory_mb",
    "parse_walltime",
    "split_array_first",
]


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NativeStatus:
    """What a scheduler says about one job or array element.

    Attributes:
        native_id: the element's id in the scheduler's own form, e.g. ``"123_4"``
            (SLURM), ``"123.4"`` (SGE task, HTCondor cluster.proc),
            ``"123[4].server"`` (PBS), ``"123[4]"`` (LSF).
        native_state: the raw state text, as printed.
        state: ``native_state`` mapped through the scheduler's table; ``None``
            when the state is unknown (the caller logs it and carries on).
        reason: why, where the scheduler says: ``"Resources"``, ``"TIMEOUT"``,
            ``"OUT_OF_MEMORY"``, a hold reason...
        exit_code: the exit code of the element's script, where known.
        job_id: the parent (array) job id.
        array_index: the element's index in the scheduler's own base, or None
            for a job that is not an array.
    """

    native_id: str
    native_state: str
    state: TaskState | None
    reason: str = ""
    exit_code: int | None = None
    job_id: str = ""
    array_index: int | None = None


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ScriptContext:
    """The documented fields a job-script template may use.

    Attributes:
        job_name: the scheduler's job name; letters, digits and ``_ . + -``
            (a name every scheduler accepts unquoted), at most 64 characters.
        run_line: the command that starts the worker; the template ``exec``\\ s it.
        log_dir: the folder for logs; the template names each element's log
            with the scheduler's own placeholders for job id and array index.
        array_size: elements in this submission (1 for a single job).
        array_first: first index, in the scheduler's base (SGE, LSF: 1); None
            (the default) is the scheduler's first index, filled in by ``render_script``.
        array_last: last index, inclusive; defaults to ``array_first + array_size - 1``.
        max_running: at most this many elements at once; None is no limit.
        cores_per_task: cores each element (or each rank) requests.
        mem_per_core_mb: memory per core in MiB; None leaves it to the site.
        walltime_s: the time limit in seconds; None leaves it to the site.
        queue: partition (SLURM) or queue (others); None is the default one.
        account: the account (project) to charge; None is the default one.
        qos: quality of service (SLURM, LSF service class); None is the default.
        gpus: GPUs per element (0: none).
        extra_directives: raw directive lines the user adds. A line that does
            not start with ``#`` gets the scheduler's directive prefix
            (``#SBATCH `` ...).
        env_setup: shell lines run before the run line (``module load python``).
        env: variables to export in the script.
        additional: free per-cluster properties a template may read
            (``additional.get("pe", "smp")``).
        communicating: one job of ``ranks`` ranks (MPI) instead of an array.
        ranks: the number of ranks of a communicating job.
    """

    job_name: str
    run_line: str
    log_dir: str
    array_size: int = 1
    array_first: int | None = None
    array_last: int | None = None
    max_running: int | None = None
    cores_per_task: int = 1
    mem_per_core_mb: int | None = None
    walltime_s: int | None = None
    queue: str | None = None
    account: str | None = None
    qos: str | None = None
    gpus: int = 0
    extra_directives: Sequence[str] = ()
    env_setup: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    additional: Mapping[str, Any] = field(default_factory=dict)
    communicating: bool = False
    ranks: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.job_name, str) or not _NAME_RE.match(self.job_name):
            raise ConfigError(
                f"job_name {self.job_name!r}: use letters, digits and _ . + - "
                "(starting with a letter or digit); see ScriptContext.safe_name()"
            )
        if len(self.job_name) > 64:
            raise ConfigError(f"job_name {self.job_name!r} is longer than 64 characters")
        if not self.run_line or "\n" in self.run_line:
            raise ConfigError(f"run_line must be one non-empty line, got {self.run_line!r}")
        if not self.log_dir or "\n" in self.log_dir or '"' in self.log_dir:
            raise ConfigError(
                f"log_dir {self.log_dir!r}: must be a path without newlines or quotes"
            )
        _positive("array_size", self.array_size)
        if self.array_first is None:
            if self.array_last is not None:
                raise ConfigError(f"array_last {self.array_last} needs array_first")
            return self._check_rest()
        _non_negative("array_first", self.array_first)
        last = self.array_first + self.array_size - 1
        if self.array_last is None:
            object.__setattr__(self, "array_last", last)
        elif self.array_last != last:
            raise ConfigError(
                f"array_last {self.array_last} does not match array_first {self.array_first} "
                f"+ array_size {self.array_size} - 1 = {last}"
            )
        self._check_rest()

    def _check_rest(self) -> None:
        if self.max_running is not None:
            _positive("max_running", self.max_running)
        _positive("cores_per_task", self.cores_per_task)
        if self.mem_per_core_mb is not None:
            _positive("mem_per_core_mb", self.mem_per_core_mb)
        if self.walltime_s is not None:
            _positive("walltime_s", self.walltime_s)
        _non_negative("gpus", self.gpus)
        _positive("ranks", self.ranks)
        if self.communicating and self.array_size != 1:
            raise ConfigError(
                f"a communicating job is one job of {self.ranks} ranks, not an array "
                f"(array_size={self.array_size})"
            )
        for name in ("queue", "account", "qos"):
            value = getattr(self, name)
            if value is not None and (not value or any(c.isspace() for c in value)):
                raise ConfigError(f"{name} {value!r}: must be a non-empty word")
        object.__setattr__(self, "extra_directives", tuple(self.extra_directives))
        object.__setattr__(self, "env_setup", tuple(self.env_setup))
        for line in (*self.extra_directives, *self.env_setup):
            if not isinstance(line, str) or "\n" in line:
                raise ConfigError(f"directive and env_setup entries are single lines, got {line!r}")
        for key, value in self.env.items():
            if not _ENV_RE.match(key):
                raise ConfigError(f"env: {key!r} is not a valid variable name")
            if not isinstance(value, str):
                raise ConfigError(f"env[{key!r}]: values are strings, got {type(value).__name__}")

    @property
    def walltime(self) -> str:
        """``walltime_s`` as ``HH:MM:SS`` (hours may exceed 24); empty when unset."""
        return "" if self.walltime_s is None else format_walltime(self.walltime_s)

    @property
    def mem_total_mb(self) -> int | None:
        """Memory for the whole element: ``mem_per_core_mb * cores_per_task``."""
        if self.mem_per_core_mb is None:
            return None
        return self.mem_per_core_mb * self.cores_per_task

    @staticmethod
    def safe_name(name: str, max_len: int = 64) -> str:
        """``name`` with every character a scheduler may refuse replaced by ``_``."""
        cleaned = re.sub(r"[^A-Za-z0-9_.+-]", "_", name).strip("._+-") or "job"
        if not cleaned[0].isalnum():
            cleaned = "j" + cleaned
        return cleaned[:max_len]

    def with_base(self, base: int) -> ScriptContext:
        """This context with ``array_first`` set to ``base`` when it was left None."""
        if self.array_first is not None:
            return self
        return dataclasses.replace(self, array_first=base, array_last=None)

    def fields(self) -> dict[str, Any]:
        """Every template field by name, the derived ones (walltime, mem_total_mb) included."""
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values["walltime"] = self.walltime
        values["mem_total_mb"] = self.mem_total_mb
        return values


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _non_negative(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")


# ---------------------------------------------------------------------------
# The protocol
# ---------------------------------------------------------------------------


@runtime_checkable
class SchedulerSyntax(Protocol):
    """The pure, per-scheduler part of a batch cluster.

    Attributes:
        name: registry key, e.g. ``"slurm"``.
        submit_command, status_command, cancel_command: the executables
            needed; post-construct checks that they exist.
        array_index_var: the environment variable that holds the element
            index inside a job (``SLURM_ARRAY_TASK_ID``, ``SGE_TASK_ID``...).
        array_index_base: the first index the scheduler allows (SGE, LSF: 1).
        default_max_array_size: elements per submission when the limit cannot
            be asked.
        states: native state -> TaskState.
    """

    name: str
    submit_command: str
    status_command: str
    cancel_command: str
    array_index_var: str
    array_index_base: int
    default_max_array_size: int
    states: Mapping[str, TaskState]

    def render_script(self, ctx: ScriptContext, template: str | None = None) -> str:
        """The job script for ``ctx``; ``template`` is template text replacing the built-in one."""
        ...

    def build_submit(self, script_path: str, extra_args: Sequence[str] = ()) -> list[str]:
        """argv that submits the script at ``script_path``; ``extra_args`` win over directives."""
        ...

    def parse_submit(self, stdout: str) -> str:
        """The native job id in the submit command's output; SchedulerError on anything else."""
        ...

    def build_status(self, job_ids: Sequence[str]) -> list[str]:
        """One argv asking the state of every job in ``job_ids``."""
        ...

    def parse_status(self, stdout: str) -> dict[str, NativeStatus]:
        """Element statuses keyed by native id, collapsed pending ranges expanded."""
        ...

    def build_accounting(self, job_ids: Sequence[str]) -> list[str] | None:
        """argv asking about jobs that left the queue; None when there is no such command."""
        ...

    def parse_accounting(self, stdout: str) -> dict[str, NativeStatus]:
        """Element statuses from the accounting command, keyed by native id."""
        ...

    def build_cancel(self, ids: Sequence[str]) -> list[str]:
        """argv cancelling jobs or elements (native ids)."""
        ...

    def cancel_ok(self, returncode: int, stderr: str, stdout: str = "") -> bool:
        """Whether the cancel worked; "already finished" or "unknown job" count as success.

        ``stdout`` too, because some cancel commands (SGE's qdel) print there.
        """
        ...

    def build_max_array_size(self) -> list[str] | None:
        """argv that shows the site's array size limit; None when it cannot be asked."""
        ...

    def parse_max_array_size(self, stdout: str) -> int | None:
        """Elements allowed in one submission, from ``build_max_array_size``'s output."""
        ...

    def element_id(self, job_id: str, index: int) -> str:
        """The native id of element ``index`` (scheduler's base) of array job ``job_id``."""
        ...


# ---------------------------------------------------------------------------
# Shared implementation
# ---------------------------------------------------------------------------


def _directive_filter(prefix: str) -> Any:
    def directive(line: str) -> str:
        line = line.strip()
        return line if line.startswith("#") else f"{prefix}{line}"

    return directive


def _dquote(value: object) -> str:
    """Double-quote a directive argument when it holds spaces (schedulers that parse quotes)."""
    text = str(value)
    if re.search(r"\s", text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def load_template(path: str) -> str:
    """The text of a user's template file (for ``render_script(ctx, template=...)``)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise ConfigError(f"cannot read job-script template {path!r}: {exc}") from exc


class BatchSyntax:
    """Base class implementing what most schedulers share.

    A subclass sets the class attributes of :class:`SchedulerSyntax`,
    ``directive_prefix`` (``"#SBATCH "``), and implements the builders and
    parsers that differ. Instances hold configuration only.
    """

    name: str
    submit_command: str
    status_command: str
    cancel_command: str
    array_index_var: str
    array_index_base: int = 0
    default_max_array_size: int = 1000
    states: Mapping[str, TaskState] = {}
    directive_prefix: str = "# "
    #: whether build_cancel accepts element ids (False: only whole jobs can be cancelled)
    can_cancel_elements: bool = True
    #: the MPI launcher a communicating job's template puts before the run line
    mpi_launcher: str = "mpiexec"

    # -- script -------------------------------------------------------------

    def template_name(self) -> str:
        """The built-in template's file name under ``elsewhere/schedulers/templates``."""
        return f"{self.name}.j2"

    def builtin_template(self) -> str:
        """The text of the built-in template."""
        resource = (
            importlib.resources.files("elsewhere.schedulers")
            .joinpath("templates")
            .joinpath(self.template_name())
        )
        return resource.read_text(encoding="utf-8")

    def template_vars(self, ctx: ScriptContext) -> dict[str, Any]:
        """Scheduler-specific variables offered to the template besides the ctx fields."""
        return {}

    def render_script(self, ctx: ScriptContext, template: str | None = None) -> str:
        """Render the job script for ``ctx`` with jinja2 (StrictUndefined).

        A field the template uses but ``ctx`` lacks raises :class:`ConfigError`
        naming it; so does a template syntax error (with its line).
        """
        source = self.builtin_template() if template is None else template
        label = self.template_name() if template is None else f"user template for {self.name}"
        ctx = ctx.with_base(self.array_index_base)
        if ctx.array_first is not None and ctx.array_first < self.array_index_base:
            raise ConfigError(
                f"{self.name}: array index {ctx.array_first} is below the scheduler's "
                f"first index {self.array_index_base}"
            )
        env = jinja2.Environment(
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
            autoescape=False,
        )
        env.filters["shquote"] = lambda v: shlex.quote(str(v))
        env.filters["dquote"] = _dquote
        env.filters["directive"] = _directive_filter(self.directive_prefix)
        env.filters["walltime"] = lambda v: format_walltime(int(v))
        values = ctx.fields()
        values.update(
            ctx=ctx,
            scheduler=self.name,
            array_index_var=self.array_index_var,
            mpi_launcher=ctx.additional.get("mpi_launcher", self.mpi_launcher),
        )
        values.update(self.template_vars(ctx))
        try:
            text = env.from_string(source).render(values)
        except jinja2.UndefinedError as exc:
            raise ConfigError(
                f"{label}: {exc.message}; known fields: {', '.join(sorted(values))}"
            ) from exc
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"{label}: line {exc.lineno}: {exc.message}") from exc
        if not text.startswith("#!"):
            raise ConfigError(f"{label}: the script must start with a #! line")
        return text

    # -- commands -------------------------------------------------------------

    def build_accounting(self, job_ids: Sequence[str]) -> list[str] | None:
        """No accounting command unless the subclass has one."""
        return None

    def parse_accounting(self, stdout: str) -> dict[str, NativeStatus]:
        """Accounting output is read like status output unless the subclass differs."""
        return self.parse_status(stdout)

    def parse_status(self, stdout: str) -> dict[str, NativeStatus]:  # pragma: no cover
        """Implemented by every subclass."""
        raise NotImplementedError

    def status_ok(self, returncode: int, stderr: str) -> bool:
        """Whether a status (or accounting) command's failure still left usable output.

        Most tools exit non-zero when one of several job ids is unknown (it
        has left the queue); the output for the others is still good.
        """
        return returncode == 0

    def accounting_ok(self, returncode: int, stderr: str) -> bool:
        """Like :meth:`status_ok`, for the accounting command."""
        return self.status_ok(returncode, stderr)

    def cancel_ok(self, returncode: int, stderr: str, stdout: str = "") -> bool:
        """Success, or a message that the job is already gone."""
        return returncode == 0

    def build_max_array_size(self) -> list[str] | None:
        """No way to ask, unless the subclass has one."""
        return None

    def parse_max_array_size(self, stdout: str) -> int | None:
        """None unless the subclass can read it."""
        return None

    def element_id(self, job_id: str, index: int) -> str:  # pragma: no cover
        """Implemented by every subclass."""
        raise NotImplementedError

    def log_file(self, log_dir: str, job_name: str, job_id: str, index: int | None) -> str:
        """The path of an element's log, as the built-in template names it."""
        raise NotImplementedError  # pragma: no cover

    def state_of(self, native_state: str) -> TaskState | None:
        """``native_state`` through the table; None when unknown."""
        return self.states.get(native_state)

    def __repr__(self) -> str:
        config = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self).items()))
        return f"{type(self).__name__}({config})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items()))))


def protocol_error(scheduler: str, what: str, text: str) -> SchedulerError:
    """The error for output a parser cannot read (the text is kept in ``stderr``)."""
    if what.startswith(f"{scheduler}: cannot parse "):
        what = what[len(f"{scheduler}: cannot parse ") :]
    return SchedulerError(f"{scheduler}: cannot parse {what}", stderr=text)


# ---------------------------------------------------------------------------
# Helpers: times, sizes, index ranges, ids
# ---------------------------------------------------------------------------

_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_walltime(value: str | int | float | _dt.timedelta) -> int:
    """Seconds in a walltime.

    Accepts seconds (int, float), a ``timedelta``, ``"[D-]HH:MM:SS"``,
    ``"MM:SS"``, ``"D-HH[:MM]"`` (SLURM), and unit strings such as ``"90m"``,
    ``"1h30m"``, ``"2d"``, ``"45s"``. A bare number in a string is seconds.
    """
    if isinstance(value, _dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = float(_parse_walltime_text(value.strip()))
    else:
        raise ConfigError(f"walltime {value!r}: expected seconds, a timedelta or a string")
    if seconds <= 0:
        raise ConfigError(f"walltime {value!r} must be positive")
    return int(-(-seconds // 1))  # round up: a limit is never shortened


def _parse_walltime_text(text: str) -> float:
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if m and (m.group(1) or ":" in text):
        days, a, b, c = m.groups()
        parts = [int(x) for x in (a, b, c) if x is not None]
        if days is not None:
            # SLURM: D-HH, D-HH:MM, D-HH:MM:SS
            parts += [0] * (3 - len(parts))
            h, mi, s = parts
            return int(days) * 86400 + h * 3600 + mi * 60 + s
        if len(parts) == 2:
            return parts[0] * 60 + parts[1]
        return parts[0] * 3600 + parts[1] * 60 + parts[2]
    units = re.findall(r"(\d+(?:\.\d+)?)\s*([smhdw])", text.lower())
    if units and re.fullmatch(r"(\s*\d+(?:\.\d+)?\s*[smhdw])+\s*", text.lower()):
        return sum(float(n) * _UNIT_S[u] for n, u in units)
    raise ConfigError(f"walltime {text!r}: use seconds, HH:MM:SS, D-HH:MM:SS or 1h30m")


def format_walltime(seconds: int) -> str:
    """``HH:MM:SS`` for a number of seconds; hours may exceed 24 (``"36:00:00"``)."""
    if seconds < 0:
        raise ConfigError(f"walltime {seconds} must not be negative")
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


_MEM_UNITS = {"": 1.0, "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0 * 1024}


def parse_memory_mb(value: str | int | float) -> int:
    """MiB in a memory size: a number (MiB) or ``"512M"``, ``"4G"``, ``"4GB"``, ``"1.5g"``, ``"2T"``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        mb = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", value)
        if not m:
            raise ConfigError(f"memory {value!r}: use a number of MiB or 512M, 4G, 1T")
        mb = float(m.group(1)) * _MEM_UNITS[m.group(2).lower()]
    else:
        raise ConfigError(f"memory {value!r}: expected MiB or a size string")
    if mb <= 0:
        raise ConfigError(f"memory {value!r} must be positive")
    return int(-(-mb // 1))


_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def expand_indices(spec: str) -> list[int]:
    """Indices in a range expression as schedulers print them.

    ``"5"``, ``"1-10"``, ``"1-10:2"`` (SGE/PBS step), ``"[5-9%2]"`` (SLURM
    pending, with throttle), ``"1,3,5-7"``. Raises ValueError on anything else.
    """
    text = spec.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.split("%", 1)[0]
    out: list[int] = []
    for part in text.split(","):
        m = _RANGE_RE.match(part.strip())
        if not m:
            raise ValueError(f"not an index range: {spec!r}")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        step = int(m.group(3)) if m.group(3) is not None else 1
        if last < first or step < 1:
            raise ValueError(f"not an index range: {spec!r}")
        out.extend(range(first, last + 1, step))
    return out


def compress_indices(indices: Iterable[int]) -> str:
    """The shortest ``"1-3,7,9-10"`` form of a set of indices."""
    values = sorted(set(indices))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


def split_array_first(job_id: str) -> tuple[str, int]:
    """Split ``"ID@FIRST"`` into ``("ID", FIRST)``; a plain id has first index 0.

    Schedulers whose elements are numbered by position (HTCondor procs, Flux
    copies) carry the first index of the submission in their job id this way.
    """
    base, sep, first = job_id.rpartition("@")
    if sep and first.isdigit():
        return base, int(first)
    return job_id, 0


def parse_int(text: str) -> int | None:
    """An int, or None for empty / ``-`` / ``undefined`` / ``N/A`` and other non-numbers."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            return None
        return int(f) if f.is_integer() else None
