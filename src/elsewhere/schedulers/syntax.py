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
    queue         --build_free_cpus-> argv --(base runs it)--> stdout --parse_free_cpus--> FreeCpus

Because every method is pure, each scheduler is tested on text captured from
the real tool (``tests/schedulers/captured``), and the same parsers read the
output of the stateful fakes in ``tests/fakes``.

This module holds the :class:`SchedulerSyntax` protocol and the
:class:`BatchSyntax` base class that implements the common parts. What they
share lives next to it, one concept a module, and is importable from here too
(scheduler plugins written against this module keep working):
:mod:`~elsewhere.schedulers.context` (:class:`ScriptContext`),
:mod:`~elsewhere.schedulers.status` (:class:`NativeStatus`, ``parse_int``,
``protocol_error``), :mod:`~elsewhere.schedulers.capacity` (:class:`FreeCpus`, what the
free-CPU query returns), :mod:`~elsewhere.schedulers.indices` (index ranges) and
:mod:`~elsewhere.schedulers.resources` (walltimes and memory, read by the one
grammar of :mod:`elsewhere.util.units`).
"""

from __future__ import annotations

import importlib.resources
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import jinja2

from elsewhere.schedulers.capacity import FreeCpus
from elsewhere.schedulers.context import ScriptContext
from elsewhere.schedulers.indices import compress_indices, expand_indices, split_array_first
from elsewhere.schedulers.resources import format_walltime, parse_memory_mb, parse_walltime
from elsewhere.schedulers.status import NativeStatus, parse_int, protocol_error
from elsewhere.util.errors import ConfigError
from elsewhere.util.states import TaskState

__all__ = [
    "BatchSyntax",
    "FreeCpus",
    "NativeStatus",
    "SchedulerSyntax",
    "ScriptContext",
    "compress_indices",
    "expand_indices",
    "format_walltime",
    "load_template",
    "parse_int",
    "parse_memory_mb",
    "parse_walltime",
    "protocol_error",
    "split_array_first",
]


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

    def build_free_cpus(self, queue: str | None) -> list[str] | None:
        """argv that shows the CPUs of ``queue`` (None: the queue jobs go to by default);
        None when the scheduler cannot be asked. Optional: the batch backend then sizes a
        job's array without it (see ``elsewhere.backends.packing``)."""
        ...

    def parse_free_cpus(self, stdout: str, queue: str | None) -> FreeCpus | None:
        """The idle and usable CPUs of ``queue`` in ``build_free_cpus``'s output; None when
        the output does not say (an unknown queue): never raise for that."""
        ...


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

    def build_dependency(self, job_ids: Sequence[str]) -> list[str] | None:
        """Words of the submit command that make a job wait until every job of ``job_ids``
        (native ids, as ``parse_submit`` gave them) has finished OK, every element exited 0
        (``["--dependency=afterok:12:13"]``), for ``after=``; None (this default) when the
        scheduler has none the library uses: the library then holds the job until they
        finished. Optional for a plugin (not part of :class:`SchedulerSyntax`)."""
        return None

    def build_free_cpus(self, queue: str | None) -> list[str] | None:
        """None: the queue's CPUs cannot be asked, unless the subclass can."""
        return None

    def parse_free_cpus(self, stdout: str, queue: str | None) -> FreeCpus | None:
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
