"""PBS: OpenPBS / PBS Pro, Torque, and Debian's PBS-style wrappers over SLURM.

Three ``variant``\\ s share the commands qsub, qstat and qdel and differ in
their output:

- ``"openpbs"``: arrays are ``qsub -J 0-9[%N]``, ids ``123[].server`` and
  ``123[4].server``; status is ``qstat -f -F json -x -t IDS`` (JSON, finished
  jobs included while the server keeps job history). Index variable
  ``PBS_ARRAY_INDEX``.
- ``"torque"``: arrays are ``qsub -t 0-9[%N]``, the same id forms; status is
  the text of ``qstat -f -t IDS`` (``Job Id: ...`` blocks of ``key = value``
  lines); completed jobs stay as state ``C`` with ``exit_status`` for
  ``keep_completed`` seconds. Index variable ``PBS_ARRAYID``.
- ``"slurm-torque"``: the Perl wrappers of Debian's ``slurm-wlm-torque``
  driving SLURM. Their qsub prints a bare SLURM job id (``19``); their qstat
  knows only ``-f`` and prints each started element under its own raw SLURM
  id, without its array index, and finished jobs as ``C`` without an exit
  status; their qdel turns any id into a number, so ``qdel 19[4]`` would
  cancel the whole array. So with this variant the status is per job, not
  per element, and :attr:`PBSSyntax.can_cancel_elements` is False (the
  template still exports ``PBS_ARRAYID``, from ``SLURM_ARRAY_TASK_ID``).

PBS directives cannot name a log per element portably (Torque and OpenPBS
name array output files differently, and the SLURM wrappers override ``-o``
on their command line), so the template redirects the script's own output to
``LOG_DIR/NAME-JOBID_INDEX.log`` itself; ``-o`` only catches what the
scheduler writes outside the script.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from elsewhere.schedulers.context import ScriptContext
from elsewhere.schedulers.status import NativeStatus, parse_int, protocol_error
from elsewhere.schedulers.syntax import BatchSyntax
from elsewhere.util.errors import ConfigError, SchedulerError
from elsewhere.util.signals import killed_by
from elsewhere.util.states import TaskState

__all__ = ["PBSSyntax"]

Q, R, F, X, C = (
    TaskState.QUEUED,
    TaskState.RUNNING,
    TaskState.FINISHED,
    TaskState.FAILED,
    TaskState.CANCELLED,
)

#: job_state letters -> TaskState. F/X (OpenPBS finished, finished subjob) and
#: C (Torque completed) become failed or cancelled by the exit status.
PBS_STATES: Mapping[str, TaskState] = MappingProxyType(
    {
        "Q": Q,
        "H": Q,
        "W": Q,
        "T": Q,
        "M": Q,
        "R": R,
        "E": R,
        "S": R,
        "U": R,
        "B": R,
        "F": F,
        "X": F,
        "C": F,
    }
)

VARIANTS = ("openpbs", "torque", "slurm-torque")

# Exit statuses the MOM sets for jobs it killed for a limit.
_LIMIT_EXITS = {
    # OpenPBS / PBS Pro (JOB_EXEC_KILL_*)
    -29: "TIMEOUT",
    -28: "TIMEOUT",
    -27: "OUT_OF_MEMORY",
    -26: "OUT_OF_MEMORY",
    # Torque (JOB_EXEC_OVERLIMIT_*)
    -11: "TIMEOUT",
    -10: "OUT_OF_MEMORY",
}

_ID_RE = re.compile(r"^(\d+)(?:\[(\d*)\])?(\.\S+)?$")


class PBSSyntax(BatchSyntax):
    """PBS job arrays; see the module docstring for the three variants.

    Args:
        variant: ``"openpbs"`` (default), ``"torque"`` or ``"slurm-torque"``.
    """

    name = "pbs"
    submit_command = "qsub"
    status_command = "qstat"
    cancel_command = "qdel"
    array_index_base = 0
    default_max_array_size = 10000
    states = PBS_STATES
    directive_prefix = "#PBS "
    mpi_launcher = "mpiexec"

    def __init__(self, variant: str = "openpbs") -> None:
        if variant not in VARIANTS:
            raise ConfigError(f"pbs variant {variant!r}: use one of {', '.join(VARIANTS)}")
        self.variant = variant
        #: ``PBS_ARRAY_INDEX`` (OpenPBS) or ``PBS_ARRAYID`` (Torque and the wrappers)
        self.array_index_var = "PBS_ARRAY_INDEX" if variant == "openpbs" else "PBS_ARRAYID"
        #: False for the SLURM wrappers, whose qdel would cancel the whole array
        self.can_cancel_elements = variant != "slurm-torque"

    def template_vars(self, ctx: ScriptContext) -> dict[str, object]:
        """``variant`` for the template."""
        return {"variant": self.variant}

    # -- submit -----------------------------------------------------------------------

    def build_submit(self, script_path: str, extra_args: Sequence[str] = ()) -> list[str]:
        """``qsub [extra] script``: command-line options override ``#PBS`` lines."""
        return ["qsub", *extra_args, script_path]

    def build_dependency(self, job_ids: Sequence[str]) -> list[str] | None:
        """``-W depend=afterok:ID[:ID]`` (Torque: ``afterokarray:ID`` for an array job's
        ``123[]`` ids; the SLURM wrappers pass it on as ``--dependency=afterok``)."""
        if not job_ids:
            return None
        if self.variant == "torque":
            array = [i for i in job_ids if "[]" in i]
            plain = [i for i in job_ids if "[]" not in i]
            parts = [f"afterok:{':'.join(plain)}"] if plain else []
            parts += [f"afterokarray:{':'.join(array)}"] if array else []
            return ["-W", f"depend={','.join(parts)}"]
        return ["-W", f"depend=afterok:{':'.join(job_ids)}"]

    def parse_submit(self, stdout: str) -> str:
        """``123[].server``, ``123.server`` or (SLURM wrappers) ``123``."""
        for line in reversed(stdout.strip().splitlines()):
            if _ID_RE.match(line.strip()):
                return line.strip()
        raise protocol_error(self.name, "qsub output (expected a job id)", stdout)

    # -- status -----------------------------------------------------------------------

    def build_status(self, job_ids: Sequence[str]) -> list[str]:
        """One ``qstat -f`` for all jobs, in the variant's form."""
        if self.variant == "openpbs":
            return ["qstat", "-f", "-F", "json", "-x", "-t", *job_ids]
        if self.variant == "torque":
            return ["qstat", "-f", "-t", *job_ids]
        return ["qstat", "-f", *job_ids]

    def status_ok(self, returncode: int, stderr: str) -> bool:
        """``qstat: Unknown Job Id`` (exit 153) for jobs that left; the others are listed."""
        if returncode == 0:
            return True
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        if not lines:  # the SLURM wrappers exit 153 silently when no job matched
            return returncode == 153
        return all("Unknown Job Id" in ln or "Job has finished" in ln for ln in lines)

    def parse_status(self, stdout: str) -> dict[str, NativeStatus]:
        """Read ``qstat -f`` JSON (OpenPBS) or text (Torque, wrappers)."""
        text = stdout.strip()
        if not text:
            return {}
        jobs = _parse_json(text) if text.startswith("{") else _parse_text(text)
        out: dict[str, NativeStatus] = {}
        for nid, attrs in jobs.items():
            status = self._status(nid, attrs)
            out[status.native_id] = status
        return out

    def _status(self, nid: str, attrs: Mapping[str, Any]) -> NativeStatus:
        m = _ID_RE.match(nid)
        if not m:
            raise protocol_error(self.name, f"job id {nid!r}", json.dumps(attrs, default=str))
        number, index_text, suffix = m.group(1), m.group(2), m.group(3) or ""
        index = int(index_text) if index_text else None
        job_id = f"{number}[]{suffix}" if m.group(2) is not None else nid
        native_state = str(attrs.get("job_state", "")).strip()
        state = self.states.get(native_state)
        raw_exit = attrs.get("Exit_status", attrs.get("exit_status"))
        exit_code = parse_int(str(raw_exit)) if raw_exit is not None else None
        reason = ""
        if state is Q:
            reason = str(attrs.get("comment", "")).strip()
            if native_state == "H":
                reason = reason or "held"
        if state is F and exit_code is not None and exit_code != 0:
            state, reason, exit_code = _finished_badly(exit_code)
        return NativeStatus(nid, native_state, state, reason, exit_code, job_id, index)

    # -- accounting ---------------------------------------------------------------------

    def build_accounting(self, job_ids: Sequence[str]) -> list[str] | None:
        """OpenPBS: ``qstat -x`` (job history) is the status command already; the others have none."""
        if self.variant == "openpbs":
            return self.build_status(job_ids)
        return None

    # -- cancel -------------------------------------------------------------------------

    def build_cancel(self, ids: Sequence[str]) -> list[str]:
        """``qdel IDS``; with the SLURM wrappers only whole jobs (SchedulerError for an element)."""
        if not self.can_cancel_elements:
            elements = [i for i in ids if "[" in i or "_" in i]
            if elements:
                raise SchedulerError(
                    "pbs (slurm-torque wrappers): qdel cannot cancel one array element "
                    f"({', '.join(elements)}); it would cancel the whole array"
                )
        return ["qdel", *ids]

    def cancel_ok(self, returncode: int, stderr: str, stdout: str = "") -> bool:
        """``Unknown Job Id`` / ``Job has finished`` / an invalid state: already gone."""
        if returncode == 0:
            return True
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        if not lines:
            # the SLURM wrappers exit 1 silently for finished and unknown jobs, and
            # print other errors ("qdel: Kill job error on job id ...") on stdout
            return self.variant == "slurm-torque" and "error" not in stdout
        gone = ("Unknown Job Id", "Job has finished", "invalid state for job", "COMPLETE")
        return all(any(g in ln for g in gone) for ln in lines)

    # -- limits, ids, logs ----------------------------------------------------------------

    def build_max_array_size(self) -> list[str] | None:
        """``qstat -B -f`` (server attributes); the SLURM wrappers have no -B."""
        return None if self.variant == "slurm-torque" else ["qstat", "-B", "-f"]

    def parse_max_array_size(self, stdout: str) -> int | None:
        """``max_array_size = 10000`` (OpenPBS) or ``max_job_array_size`` (Torque)."""
        m = re.search(r"^\s*max_(?:job_)?array_size\s*=\s*(\d+)", stdout, re.MULTILINE)
        return int(m.group(1)) if m else None

    def element_id(self, job_id: str, index: int) -> str:
        """``123[].server`` + 4 -> ``123[4].server``; a job that is no array is its own element."""
        m = _ID_RE.match(job_id)
        if m and m.group(2) == "":
            return f"{m.group(1)}[{index}]{m.group(3) or ''}"
        if m and m.group(2) is None and self.variant == "slurm-torque":
            return f"{m.group(1)}[{index}]"
        return job_id

    def log_file(self, log_dir: str, job_name: str, job_id: str, index: int | None) -> str:
        """``LOG_DIR/NAME-NUMBER_INDEX.log`` (``NAME-NUMBER.log`` without an index)."""
        number = re.match(r"\d+", job_id)
        num = number.group(0) if number else job_id
        if index is None:
            return f"{log_dir}/{job_name}-{num}.log"
        return f"{log_dir}/{job_name}-{num}_{index}.log"


def _finished_badly(exit_code: int) -> tuple[TaskState, str, int]:
    if exit_code in _LIMIT_EXITS:
        return X, _LIMIT_EXITS[exit_code], exit_code
    if exit_code > 256:
        # the MOM reports a job killed by a signal as 256 + signal; qdel sends SIGTERM then SIGKILL
        signal = exit_code - 256
        if signal in (9, 15):
            return C, killed_by(signal, "qdel, or a limit"), 128 + signal
        return X, killed_by(signal), 128 + signal
    if exit_code < 0:
        return X, f"PBS exit status {exit_code}", exit_code
    return X, "", exit_code


def _parse_json(text: str) -> Mapping[str, Mapping[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise protocol_error("pbs", f"qstat -F json output ({exc})", text) from None
    jobs = data.get("Jobs", {}) if isinstance(data, dict) else None
    if not isinstance(jobs, dict):
        raise protocol_error("pbs", "qstat -F json output (no Jobs object)", text)
    return {str(k): v for k, v in jobs.items() if isinstance(v, dict)}


def _parse_text(text: str) -> Mapping[str, Mapping[str, Any]]:
    jobs: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    last_key = ""
    for line in text.splitlines():
        if not line.strip():
            continue
        m = re.match(r"^Job Id:\s*(\S+)\s*$", line)
        if m:
            current = jobs.setdefault(m.group(1), {})
            last_key = ""
            continue
        if current is None:
            raise protocol_error("pbs", "qstat -f output (expected 'Job Id:' first)", text)
        a = re.match(r"^\s+([A-Za-z_][\w.]*) = (.*)$", line)
        if a:
            last_key = a.group(1)
            current[last_key] = a.group(2).strip()
        elif last_key:
            # Torque wraps long values onto lines that start with a tab
            current[last_key] += line.strip()
    return jobs


class SlurmTorqueSyntax(PBSSyntax):
    """Debian's PBS wrappers over SLURM: submit with their ``qsub``, follow with SLURM's own tools.

    The wrappers' ``qstat`` reports one status per job (not per element) and
    their ``qdel`` cancels whole arrays only; the wrappers always run on a
    SLURM, so status, accounting and cancel go to ``squeue``, ``sacct`` and
    ``scancel``, which know each element (``123_4``).
    """

    status_command = "squeue"
    cancel_command = "scancel"

    def __init__(self, variant: str = "slurm-torque", **slurm: Any) -> None:
        super().__init__(variant="slurm-torque")
        from .slurm import SlurmSyntax

        self._slurm = SlurmSyntax(**slurm)
        self.can_cancel_elements = True

    def build_status(self, job_ids: Sequence[str]) -> list[str]:
        """``squeue`` for all jobs (the wrappers' qstat cannot tell elements apart)."""
        return self._slurm.build_status(job_ids)

    def status_ok(self, returncode: int, stderr: str) -> bool:
        return self._slurm.status_ok(returncode, stderr)

    def parse_status(self, stdout: str) -> dict[str, NativeStatus]:
        return self._slurm.parse_status(stdout)

    def build_accounting(self, job_ids: Sequence[str]) -> list[str] | None:
        return self._slurm.build_accounting(job_ids)

    def accounting_ok(self, returncode: int, stderr: str) -> bool:
        return self._slurm.accounting_ok(returncode, stderr)

    def parse_accounting(self, stdout: str) -> dict[str, NativeStatus]:
        return self._slurm.parse_accounting(stdout)

    def build_cancel(self, ids: Sequence[str]) -> list[str]:
        return self._slurm.build_cancel(ids)

    def cancel_ok(self, returncode: int, stderr: str, stdout: str = "") -> bool:
        return self._slurm.cancel_ok(returncode, stderr, stdout)

    def element_id(self, job_id: str, index: int) -> str:
        number = re.match(r"\d+", job_id)
        return self._slurm.element_id(number.group(0) if number else job_id, index)
