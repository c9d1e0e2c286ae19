"""IBM Spectrum LSF: bsub, bjobs, bhist, bkill, bparams.

``bsub`` reads ``#BSUB`` directives only from a script given on standard
input (``bsub < script``), so the submit argv is ``sh -c 'exec bsub "$@" <
"$0"' SCRIPT [extra...]``. An array is named ``"NAME[1-10]%2"``; indices
start at 1.

Status: ``bjobs -a -noheader -o "jobid jobindex stat exit_code exit_reason
pend_reason delimiter='|'" IDS`` prints one line per element (``-`` for an
empty field; ``jobindex`` 0 for a job that is not an array) and keeps finished
jobs for ``CLEAN_PERIOD`` (an hour by default). After that, ``bhist -l -a``
still knows them; its long records are parsed for the final event.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from elsewhere.schedulers.context import ScriptContext
from elsewhere.schedulers.resources import format_walltime_hm
from elsewhere.schedulers.status import NativeStatus, parse_int, protocol_error
from elsewhere.schedulers.syntax import BatchSyntax
from elsewhere.util.states import TaskState

__all__ = ["LSFSyntax"]

Q, R, F, X, C = (
    TaskState.QUEUED,
    TaskState.RUNNING,
    TaskState.FINISHED,
    TaskState.FAILED,
    TaskState.CANCELLED,
)

#: bjobs STAT -> TaskState. EXIT becomes cancelled when the exit reason says
#: the owner or an administrator killed the job (TERM_OWNER, TERM_ADMIN...).
LSF_STATES: Mapping[str, TaskState] = MappingProxyType(
    {
        "PEND": Q,
        "PROV": Q,
        "PSUSP": Q,
        "WAIT": Q,
        "RUN": R,
        "USUSP": R,
        "SSUSP": R,
        "UNKWN": R,
        "DONE": F,
        "EXIT": X,
        "ZOMBI": C,
    }
)

BJOBS_FIELDS = "jobid jobindex stat exit_code exit_reason pend_reason"

# exit reasons (TERM_*) that mean a person cancelled the job, and the ones we
# report as SLURM-like reasons
_CANCEL_TERMS = {
    "TERM_OWNER",
    "TERM_ADMIN",
    "TERM_FORCE_OWNER",
    "TERM_FORCE_ADMIN",
    "TERM_REQUEUE_OWNER",
}
_TERM_REASONS = {
    "TERM_RUNLIMIT": "TIMEOUT",
    "TERM_CPULIMIT": "TIMEOUT",
    "TERM_DEADLINE": "TIMEOUT",
    "TERM_MEMLIMIT": "OUT_OF_MEMORY",
    "TERM_SWAP": "OUT_OF_MEMORY",
    "TERM_HOST": "NODE_FAIL",
    "TERM_LOAD": "NODE_FAIL",
}


class LSFSyntax(BatchSyntax):
    """LSF job arrays (``-J "name[1-N]%M"``), status by ``bjobs -o``, history by bhist."""

    name = "lsf"
    submit_command = "bsub"
    status_command = "bjobs"
    cancel_command = "bkill"
    array_index_var = "LSB_JOBINDEX"
    array_index_base = 1
    default_max_array_size = 1000
    states = LSF_STATES
    directive_prefix = "#BSUB "
    mpi_launcher = "mpirun"

    # -- submit ---------------------------------------------------------------------

    def build_submit(self, script_path: str, extra_args: Sequence[str] = ()) -> list[str]:
        """``sh -c 'exec bsub "$@" < "$0"' SCRIPT [extra]``: bsub reads #BSUB only from stdin.

        Command-line options override the script's ``#BSUB`` lines.
        """
        return ["sh", "-c", 'exec bsub "$@" < "$0"', script_path, *extra_args]

    def build_dependency(self, job_ids: Sequence[str]) -> list[str] | None:
        """``-w "done(ID) && done(ID)"``: an array job's id stands for all its elements."""
        return ["-w", " && ".join(f"done({i})" for i in job_ids)] if job_ids else None

    def parse_submit(self, stdout: str) -> str:
        """``Job <123> is submitted to default queue <normal>.`` -> ``123``."""
        m = re.search(r"Job <(\d+)> is submitted", stdout)
        if not m:
            raise protocol_error(self.name, "bsub output (expected 'Job <N> is submitted')", stdout)
        return m.group(1)

    # -- status -----------------------------------------------------------------------

    def build_status(self, job_ids: Sequence[str]) -> list[str]:
        """One ``bjobs -a -noheader -o ... IDS`` call."""
        return ["bjobs", "-a", "-noheader", "-o", f"{BJOBS_FIELDS} delimiter='|'", *job_ids]

    def status_ok(self, returncode: int, stderr: str) -> bool:
        """``Job <N> is not found`` for jobs that left; the others are still listed."""
        if returncode == 0:
            return True
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        return all("is not found" in ln or "No unfinished job" in ln for ln in lines)

    def parse_status(self, stdout: str) -> dict[str, NativeStatus]:
        """Read ``jobid|jobindex|stat|exit_code|exit_reason|pend_reason`` lines."""
        out: dict[str, NativeStatus] = {}
        for line in stdout.splitlines():
            if not line.strip() or line.startswith(("No unfinished job", "No job found")):
                continue
            parts = line.strip().split("|", 5)
            if len(parts) != 6 or not parts[0].strip().isdigit():
                raise protocol_error(
                    self.name,
                    "bjobs line (expected jobid|jobindex|stat|exit_code|exit_reason|pend_reason)",
                    line,
                )
            job_id, index_text, stat, exit_text, exit_reason, pend_reason = (
                p.strip() for p in parts
            )
            index = parse_int(index_text)
            index = index if index else None
            nid = job_id if index is None else f"{job_id}[{index}]"
            exit_code = parse_int(exit_text)
            if stat == "DONE" and exit_code is None:
                exit_code = 0
            out[nid] = self._status(nid, stat, exit_code, exit_reason, pend_reason, job_id, index)
        return out

    def _status(
        self,
        nid: str,
        stat: str,
        exit_code: int | None,
        exit_reason: str,
        pend_reason: str,
        job_id: str,
        index: int | None,
    ) -> NativeStatus:
        state = self.states.get(stat)
        exit_reason = "" if exit_reason == "-" else exit_reason
        pend_reason = "" if pend_reason == "-" else pend_reason
        term = exit_reason.split(":", 1)[0].strip()
        reason = pend_reason if stat == "PEND" else exit_reason
        if stat == "EXIT" and term in _CANCEL_TERMS:
            state = C
        if term in _TERM_REASONS:
            reason = _TERM_REASONS[term]
        return NativeStatus(nid, stat, state, reason, exit_code, job_id, index)

    # -- accounting ---------------------------------------------------------------------

    def build_accounting(self, job_ids: Sequence[str]) -> list[str] | None:
        """``bhist -l -a IDS``: the event history of jobs that bjobs has forgotten."""
        return ["bhist", "-l", "-a", *job_ids]

    def parse_accounting(self, stdout: str) -> dict[str, NativeStatus]:
        """Read ``bhist -l`` records (separated by rulers of dashes) for each job's last event."""
        out: dict[str, NativeStatus] = {}
        for record in re.split(r"^-{20,}\s*$", stdout, flags=re.MULTILINE):
            text = _unwrap(record)
            m = re.search(r"^Job <(\d+)(?:\[(\d+)\])?>", text, re.MULTILINE)
            if not m:
                continue
            job_id, index = m.group(1), (int(m.group(2)) if m.group(2) else None)
            nid = job_id if index is None else f"{job_id}[{index}]"
            stat, exit_code, exit_reason = _bhist_outcome(text)
            out[nid] = self._status(nid, stat, exit_code, exit_reason, "", job_id, index)
        return out

    # -- cancel -------------------------------------------------------------------------

    def build_cancel(self, ids: Sequence[str]) -> list[str]:
        """``bkill 123 124[4]``."""
        return ["bkill", *ids]

    def cancel_ok(self, returncode: int, stderr: str, stdout: str = "") -> bool:
        """ "Job has already finished" and "No matching job found" count as success."""
        if returncode == 0:
            return True
        gone = ("has already finished", "No matching job found", "is not found")
        done = ("is being terminated", "is being signaled")
        lines = [ln for ln in (stderr + "\n" + stdout).splitlines() if ln.strip()]
        problems = [ln for ln in lines if not any(d in ln for d in done)]
        return bool(problems) and all(any(g in ln for g in gone) for ln in problems)

    # -- limits, ids, logs ----------------------------------------------------------------

    def build_max_array_size(self) -> list[str] | None:
        """``bparams -l`` (MAX_JOB_ARRAY_SIZE)."""
        return ["bparams", "-l"]

    def parse_max_array_size(self, stdout: str) -> int | None:
        """``MAX_JOB_ARRAY_SIZE = 1000``."""
        m = re.search(r"MAX_JOB_ARRAY_SIZE\s*=\s*(\d+)", stdout)
        return int(m.group(1)) if m else None

    def template_vars(self, ctx: ScriptContext) -> dict[str, object]:
        """``lsf_walltime``: the limit as ``H:MM`` (bsub -W counts minutes)."""
        return {
            "lsf_walltime": "" if ctx.walltime_s is None else format_walltime_hm(ctx.walltime_s)
        }

    def element_id(self, job_id: str, index: int) -> str:
        """``123`` + 4 -> ``123[4]``."""
        return f"{job_id}[{index}]"

    def log_file(self, log_dir: str, job_name: str, job_id: str, index: int | None) -> str:
        """``LOG_DIR/NAME-JOB_INDEX.log`` (``NAME-JOB.log`` for a communicating job)."""
        if index is None:
            return f"{log_dir}/{job_name}-{job_id}.log"
        return f"{log_dir}/{job_name}-{job_id}_{index}.log"


def _unwrap(record: str) -> str:
    """Join bhist's wrapped lines: a continuation line starts with many spaces."""
    lines: list[str] = []
    for line in record.splitlines():
        if line.startswith(" " * 21) and lines:
            lines[-1] += line[21:]  # a space right after the indent belongs to the text
        else:
            lines.append(line)
    return "\n".join(ln.rstrip() for ln in lines)


def _bhist_outcome(text: str) -> tuple[str, int | None, str]:
    """(bjobs-like STAT, exit code, exit reason) from the events of one bhist record."""
    term = re.search(r"Completed <exit>;\s*(TERM_\w+)(?::\s*([^.;\n]*))?", text)
    exit_reason = ""
    if term:
        exit_reason = term.group(1) + (f": {term.group(2).strip()}" if term.group(2) else "")
    if re.search(r"Done successfully", text):
        return "DONE", 0, ""
    m = re.search(r"Exited with exit code (\d+)", text)
    if m:
        return "EXIT", int(m.group(1)), exit_reason
    m = re.search(r"Exited by (?:LSF )?signal (\d+)", text)
    if m:
        return "EXIT", 128 + int(m.group(1)), exit_reason
    if re.search(r"Exited\b|Completed <exit>", text):
        if not exit_reason and re.search(r"Signal <KILL> requested by user or administrator", text):
            exit_reason = "TERM_OWNER: job killed by owner"
        return "EXIT", None, exit_reason
    if re.search(r"Suspended", text.rsplit("\n", 2)[-1]):
        return "USUSP", None, ""
    if re.search(r"Dispatched to|Starting \(Pid|Running with execution home", text):
        return "RUN", None, ""
    return "PEND", None, ""
