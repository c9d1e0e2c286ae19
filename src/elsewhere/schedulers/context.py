"""The documented fields a job-script template may use: :class:`ScriptContext`.

The batch backend fills one per submission with values already in the units schedulers take
(``walltime_s`` in seconds, ``mem_per_core_mb`` in MiB: :mod:`elsewhere.schedulers.resources`);
a scheduler's template writes them in its own syntax. Checked on construction, so that a
template never renders a value a scheduler would misread.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elsewhere.schedulers.resources import format_walltime
from elsewhere.util.errors import ConfigError

__all__ = ["ScriptContext"]


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ScriptContext:
    """The documented fields a job-script template may use.

    Attributes:
        job_name: the scheduler's job name; letters, digits and ``_ . + -``
            (a name every scheduler accepts unquoted), at most 64 characters.
        run_line: the command that starts the worker, every word already quoted for the
            shell (``python=``'s words, then ``-m elsewhere.worker --job DIR``); the
            template ``exec``\\ s it, after the MPI launcher for a communicating job.
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
        env_setup: shell lines run before the run line (``module load python``): the
            cluster's ``env_setup``, then the setup part of ``python=``.
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
