"""SLURM: sbatch, squeue, sacct, scancel, scontrol.

Status comes from ``squeue -t all`` (which still lists jobs that finished less
than ``MinJobAge`` ago), with one ``|``-separated line per job or element:
``%i|%T|%r|%F|%K`` (id, state, reason, array job id, array task id; ``%A`` and
``%a`` would be the element's own job id and the account). Pending elements of
an array are collapsed by squeue into one line such as
``123_[5-9%2]|PENDING|JobArrayTaskLimit|123|5-9%2``; the parser expands them.

Jobs that left squeue are found with ``sacct -X -P -n`` (needs slurmdbd), or,
with ``accounting="jobcomp"``, in the jobcomp text file
(``JobCompType=jobcomp/filetxt``), which needs no database: ``grep`` picks the
lines of our jobs (``sacct -c`` cannot be used: in 22.05 it does not know the
array fields of that file, so elements show only as raw job ids).

A partition's CPUs come from ``sinfo -h -o '%P|%C'`` (allocated/idle/other/total).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from elsewhere.schedulers.capacity import FreeCpus
from elsewhere.schedulers.indices import expand_indices
from elsewhere.schedulers.status import NativeStatus, parse_int, protocol_error
from elsewhere.schedulers.syntax import BatchSyntax
from elsewhere.util.errors import ConfigError, SchedulerError
from elsewhere.util.states import TaskState

__all__ = ["SlurmSyntax"]

Q, R, F, X, C = (
    TaskState.QUEUED,
    TaskState.RUNNING,
    TaskState.FINISHED,
    TaskState.FAILED,
    TaskState.CANCELLED,
)

#: squeue %T / sacct State (first word) -> TaskState
SLURM_STATES: Mapping[str, TaskState] = MappingProxyType(
    {
        "PENDING": Q,
        "CONFIGURING": Q,
        "REQUEUED": Q,
        "REQUEUE_HOLD": Q,
        "REQUEUE_FED": Q,
        "RESV_DEL_HOLD": Q,
        "POWER_UP_NODE": Q,
        "RUNNING": R,
        "COMPLETING": R,
        "SUSPENDED": R,
        "STOPPED": R,
        "RESIZING": R,
        "SIGNALING": R,
        "STAGE_OUT": R,
        "UPDATE_DB": R,
        "COMPLETED": F,
        "CANCELLED": C,
        "REVOKED": C,
        "FAILED": X,
        "TIMEOUT": X,
        "NODE_FAIL": X,
        "PREEMPTED": X,
        "BOOT_FAIL": X,
        "DEADLINE": X,
        "OUT_OF_MEMORY": X,
        "SPECIAL_EXIT": X,
        "LAUNCH_FAILED": X,
        "RECONFIG_FAIL": X,
    }
)

# Terminal states whose name is the best reason we will get.
_REASON_IS_STATE = {"TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}

_SQUEUE_FORMAT = "%i|%T|%r|%F|%K"
_SACCT_FIELDS = "JobID,State,ExitCode,Reason"


class SlurmSyntax(BatchSyntax):
    """SLURM job arrays (``sbatch --array``), status by squeue, history by sacct.

    Args:
        accounting: ``"sacct"`` (slurmdbd), ``"jobcomp"`` (the jobcomp text
            file, read with grep) or ``"none"``.
        jobcomp_file: the file of ``JobCompLoc`` for ``accounting="jobcomp"``.
    """

    name = "slurm"
    submit_command = "sbatch"
    status_command = "squeue"
    cancel_command = "scancel"
    array_index_var = "SLURM_ARRAY_TASK_ID"
    array_index_base = 0
    default_max_array_size = 1001
    states = SLURM_STATES
    directive_prefix = "#SBATCH "
    mpi_launcher = "srun"

    def __init__(
        self, accounting: str = "sacct", jobcomp_file: str = "/var/log/slurm/jobcomp.log"
    ) -> None:
        if accounting not in ("sacct", "jobcomp", "none"):
            raise ConfigError(f"slurm accounting {accounting!r}: use 'sacct', 'jobcomp' or 'none'")
        self.accounting = accounting
        self.jobcomp_file = jobcomp_file

    # -- submit -----------------------------------------------------------------

    def build_submit(self, script_path: str, extra_args: Sequence[str] = ()) -> list[str]:
        """``sbatch --parsable [extra] script``: command-line options override #SBATCH lines."""
        return ["sbatch", "--parsable", *extra_args, script_path]

    def build_dependency(self, job_ids: Sequence[str]) -> list[str] | None:
        """``--dependency=afterok:ID[:ID]``: an array job's id stands for all its elements."""
        return [f"--dependency=afterok:{':'.join(job_ids)}"] if job_ids else None

    def parse_submit(self, stdout: str) -> str:
        """The job id from ``--parsable`` output (``123`` or ``123;cluster``)."""
        for line in reversed(stdout.strip().splitlines()):
            m = re.fullmatch(r"\s*(\d+)(?:;\S+)?\s*", line)
            if m:
                return m.group(1)
            m = re.search(r"Submitted batch job (\d+)", line)
            if m:
                return m.group(1)
        raise protocol_error(self.name, "sbatch output (expected a job id)", stdout)

    # -- status -------------------------------------------------------------------

    def build_status(self, job_ids: Sequence[str]) -> list[str]:
        """``squeue -h -t all -j IDS -o '%i|%T|%r|%F|%K'``: one call for all jobs."""
        return ["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", _SQUEUE_FORMAT]

    def status_ok(self, returncode: int, stderr: str) -> bool:
        """squeue fails with "Invalid job id specified" when the jobs have all left."""
        return returncode == 0 or "Invalid job id specified" in stderr

    def parse_status(self, stdout: str) -> dict[str, NativeStatus]:
        """Read squeue lines; expand collapsed pending ranges into elements."""
        out: dict[str, NativeStatus] = {}
        for line in stdout.splitlines():
            if not line.strip():
                continue
            parts = line.strip().split("|")
            if len(parts) != 5:
                raise protocol_error(self.name, "squeue line (expected %i|%T|%r|%F|%K)", line)
            jid, native_state, reason, array_job, array_task = (p.strip() for p in parts)
            reason = "" if reason in ("None", "(null)") else reason
            try:
                statuses = self._expand(jid, native_state, reason, None, array_job, array_task)
            except SchedulerError as exc:
                raise protocol_error(self.name, str(exc).splitlines()[0], line) from None
            for status in statuses:
                out[status.native_id] = status
        return out

    def _status(
        self,
        native_id: str,
        native_state: str,
        reason: str,
        exit_code: int | None,
        job_id: str,
        index: int | None,
    ) -> NativeStatus:
        word = native_state.split()[0] if native_state.split() else native_state
        state = self.states.get(word)
        if state is F:
            reason = (
                ""  # sacct keeps the last pending reason ("JobArrayTaskLimit") of finished jobs
            )
        if word in _REASON_IS_STATE and not reason:
            reason = word
        if word == "CANCELLED" and native_state != word:
            # sacct: "CANCELLED by 1000" (the uid that cancelled)
            reason = reason or "cancelled " + native_state[len(word) :].strip()
        return NativeStatus(native_id, native_state, state, reason, exit_code, job_id, index)

    def _expand(
        self,
        jid: str,
        native_state: str,
        reason: str,
        exit_code: int | None,
        array_job: str,
        array_task: str,
    ) -> list[NativeStatus]:
        if array_task in ("N/A", "", "4294967294"):
            return [self._status(jid, native_state, reason, exit_code, array_job or jid, None)]
        try:
            indices = expand_indices(array_task)
        except ValueError:
            raise protocol_error(self.name, f"array index {array_task!r}", jid) from None
        return [
            self._status(f"{array_job}_{i}", native_state, reason, exit_code, array_job, i)
            for i in indices
        ]

    # -- accounting ---------------------------------------------------------------

    def build_accounting(self, job_ids: Sequence[str]) -> list[str] | None:
        """``sacct -X -P -n -j IDS -o JobID,State,ExitCode,Reason``, or grep on the jobcomp file."""
        if self.accounting == "none":
            return None
        if self.accounting == "jobcomp":
            alternatives = "|".join(re.escape(j) for j in job_ids)
            return [
                "grep",
                "-h",
                "-E",
                f"(^| )(JobId|ArrayJobId)=({alternatives}) ",
                self.jobcomp_file,
            ]
        return ["sacct", "-X", "-P", "-n", "-j", ",".join(job_ids), "-o", _SACCT_FIELDS]

    def accounting_ok(self, returncode: int, stderr: str) -> bool:
        """grep exits 1 when no line matched (nothing finished yet)."""
        if self.accounting == "jobcomp":
            return returncode in (0, 1) and not stderr.strip()
        return returncode == 0

    def parse_accounting(self, stdout: str) -> dict[str, NativeStatus]:
        """Read ``sacct -P`` lines (``123_4|COMPLETED|0:0|None``; ``123_[5-9]``
        pending ranges expand) or jobcomp lines (``JobId=3 ... JobState=FAILED
        ... ArrayJobId=1 ArrayTaskId=1 ... ExitCode=3:0``)."""
        out: dict[str, NativeStatus] = {}
        for line in stdout.splitlines():
            if not line.strip():
                continue
            if line.startswith("JobId="):
                status = self._jobcomp_status(line)
                out[status.native_id] = status
                continue
            parts = line.strip().split("|")
            if len(parts) < 3:
                raise protocol_error(self.name, "sacct line (expected JobID|State|ExitCode)", line)
            jid, native_state, exit_text = parts[0], parts[1], parts[2]
            reason = parts[3] if len(parts) > 3 else ""
            reason = "" if reason in ("None", "(null)") else reason
            if "." in jid:  # a step (batch, extern, 0): the allocation line says it all
                continue
            exit_code = _exit_code(exit_text)
            m = re.fullmatch(r"(\d+)_(\[[^\]]*\]|\d+)", jid)
            if m:
                statuses = self._expand(
                    jid, native_state, reason, exit_code, m.group(1), m.group(2)
                )
            else:
                statuses = self._expand(jid, native_state, reason, exit_code, jid, "N/A")
            for status in statuses:
                # sacct may list a requeued element twice; the last line is the newest.
                out[status.native_id] = status
        return out

    def _jobcomp_status(self, line: str) -> NativeStatus:
        fields = dict(re.findall(r"(?:^| )(\w+)=(\S*)", line))
        raw, native_state = fields.get("JobId", ""), fields.get("JobState", "")
        if not raw.isdigit() or not native_state:
            raise protocol_error(self.name, "jobcomp line (expected JobId=N ... JobState=S)", line)
        exit_code = _exit_code(fields.get("ExitCode", ""))
        array_job, task = fields.get("ArrayJobId", ""), fields.get("ArrayTaskId", "")
        if array_job.isdigit() and task.isdigit():
            return self._status(
                f"{array_job}_{task}", native_state, "", exit_code, array_job, int(task)
            )
        return self._status(raw, native_state, "", exit_code, raw, None)

    # -- cancel -------------------------------------------------------------------

    def build_cancel(self, ids: Sequence[str]) -> list[str]:
        """``scancel IDS`` (job ids or ``123_4`` element ids)."""
        return ["scancel", *ids]

    def cancel_ok(self, returncode: int, stderr: str, stdout: str = "") -> bool:
        """A job that already finished or is unknown counts as cancelled."""
        if returncode == 0:
            return True
        lines = [ln for ln in stderr.splitlines() if "error" in ln.lower()]
        gone = ("Invalid job id specified", "already completing or completed")
        return bool(lines) and all(any(g in ln for g in gone) for ln in lines)

    # -- limits, ids, logs ----------------------------------------------------------

    def build_max_array_size(self) -> list[str] | None:
        """``scontrol show config`` (MaxArraySize)."""
        return ["scontrol", "show", "config"]

    def parse_max_array_size(self, stdout: str) -> int | None:
        """``MaxArraySize = 1001``: indices 0..1000, so 1001 elements from index 0."""
        m = re.search(r"^\s*MaxArraySize\s*=\s*(\d+)", stdout, re.MULTILINE)
        return int(m.group(1)) if m else None

    def build_free_cpus(self, queue: str | None) -> list[str] | None:
        """``sinfo -h -o '%P|%C'`` (``-p QUEUE``): per partition, CPUs allocated/idle/other/total."""
        return ["sinfo", "-h", *(["-p", queue] if queue else []), "-o", "%P|%C"]

    def parse_free_cpus(self, stdout: str, queue: str | None) -> FreeCpus | None:
        """``debug*|2/6/0/8``: 6 idle, 8 usable (allocated and idle; "other" is down or
        drained). The partition named ``queue``, else the default one (marked ``*``), else
        every partition listed; lines of one partition add up. None if none is listed."""
        rows: list[tuple[str, bool, FreeCpus]] = []
        for line in stdout.splitlines():
            name, sep, cpus = line.strip().partition("|")
            parts = cpus.split("/")
            if not sep or len(parts) != 4 or not all(p.isdigit() for p in parts):
                continue
            alloc, idle = int(parts[0]), int(parts[1])
            rows.append((name.rstrip("*"), name.endswith("*"), FreeCpus(idle, alloc + idle)))
        if queue:
            chosen = [c for name, _, c in rows if name == queue]
        else:
            chosen = [c for _, default, c in rows if default] or [c for _, _, c in rows]
        return sum(chosen[1:], chosen[0]) if chosen else None

    def element_id(self, job_id: str, index: int) -> str:
        """``123`` + 4 -> ``123_4``."""
        return f"{job_id}_{index}"

    def log_file(self, log_dir: str, job_name: str, job_id: str, index: int | None) -> str:
        """``LOG_DIR/NAME-JOB_INDEX.log`` (``NAME-JOB.log`` for a communicating job)."""
        if index is None:
            return f"{log_dir}/{job_name}-{job_id}.log"
        return f"{log_dir}/{job_name}-{job_id}_{index}.log"


def _exit_code(text: str) -> int | None:
    """sacct ``ExitCode`` is ``code:signal``; a signal death is reported as 128 + signal."""
    code, _, signal = text.strip().partition(":")
    c, s = parse_int(code), parse_int(signal) if signal else 0
    if c is None:
        return None
    if c == 0 and s:
        return 128 + s
    return c
