"""HTCondor: condor_submit, condor_q, condor_history, condor_rm.

HTCondor takes a submit description, not a script with directives. The
rendered job script is therefore self-submitting: ``bash SCRIPT
--elsewhere-submit [condor_submit options]`` prints ``elsewhere-array:
FIRST-LAST`` and pipes the submit description (written by the template, with
``queue N``) into ``condor_submit``, with the script itself as the executable.
Run by HTCondor, the same script receives ``$(Cluster) $(Process)`` as
arguments and exports the element index ``ELSEWHERE_ARRAY_INDEX`` = FIRST +
Process.

Element ids are ``cluster.proc``. Procs count from 0 whatever the first index,
so a submission that does not start at 0 carries its first index in the job
id: ``"123@5"`` (see :func:`~elsewhere.schedulers.syntax.split_array_first`).
Each job ad also holds ``ElsewhereIndex`` (FIRST + Process), which the status
parser reports as ``array_index``.

Status: ``condor_q IDS -af:t ClusterId ProcId JobStatus ExitCode ExitBySignal
ExitSignal ElsewhereIndex HoldReason RemoveReason`` (tab-separated, ``undefined``
for a missing attribute). Jobs that left the queue: the same columns from
``condor_history -constraint``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from elsewhere.schedulers.context import ScriptContext
from elsewhere.schedulers.indices import split_array_first
from elsewhere.schedulers.status import NativeStatus, parse_int, protocol_error
from elsewhere.schedulers.syntax import BatchSyntax
from elsewhere.util.errors import ConfigError
from elsewhere.util.states import TaskState

__all__ = ["HTCondorSyntax"]

#: JobStatus numbers -> TaskState. 4 (Completed) is failed when the exit code
#: is not 0 or a signal ended the job; 3 (Removed) is failed with reason
#: TIMEOUT when a periodic_remove expression (our walltime) removed it. 5 (Held) stays queued,
#: with the hold reason: a held job waits for condor_release.
HTCONDOR_STATES: Mapping[str, TaskState] = MappingProxyType(
    {
        "1": TaskState.QUEUED,
        "2": TaskState.RUNNING,
        "3": TaskState.CANCELLED,
        "4": TaskState.FINISHED,
        "5": TaskState.QUEUED,
        "6": TaskState.RUNNING,
        "7": TaskState.RUNNING,
    }
)

STATUS_NAMES = {
    "1": "Idle",
    "2": "Running",
    "3": "Removed",
    "4": "Completed",
    "5": "Held",
    "6": "Transferring Output",
    "7": "Suspended",
}

ATTRIBUTES = (
    "ClusterId",
    "ProcId",
    "JobStatus",
    "ExitCode",
    "ExitBySignal",
    "ExitSignal",
    "ElsewhereIndex",
    "HoldReason",
    "RemoveReason",
)

#: the template's walltime is a periodic_remove expression; the RemoveReason
#: it leaves names it ("The job attribute PeriodicRemove expression ... evaluated to TRUE")
WALLTIME_MARK = "PeriodicRemove"


class HTCondorSyntax(BatchSyntax):
    """HTCondor clusters of ``queue N`` procs, status by ``condor_q -af``."""

    name = "htcondor"
    submit_command = "condor_submit"
    status_command = "condor_q"
    cancel_command = "condor_rm"
    array_index_var = "ELSEWHERE_ARRAY_INDEX"
    array_index_base = 0
    default_max_array_size = 20000
    states = HTCONDOR_STATES
    directive_prefix = ""

    # -- script -----------------------------------------------------------------------

    def build_dependency(self, job_ids: Sequence[str]) -> list[str] | None:
        """None: HTCondor's dependencies are DAGMan's (a DAG of submit files run by a DAGMan
        job of its own), heavier than the library holding the job until the jobs it waits
        for finished, which it does."""
        return None

    def render_script(self, ctx: ScriptContext, template: str | None = None) -> str:
        """As the base, but a communicating job needs the parallel universe: refused."""
        if ctx.communicating and template is None:
            raise ConfigError(
                "htcondor: communicating (MPI) jobs need the parallel universe, which the "
                "built-in template does not use; give a template of your own"
            )
        return super().render_script(ctx, template)

    # -- submit ---------------------------------------------------------------------------

    def build_submit(self, script_path: str, extra_args: Sequence[str] = ()) -> list[str]:
        """``bash SCRIPT --elsewhere-submit [extra]``: the script runs condor_submit.

        ``extra`` goes to condor_submit after the template's own lines; use
        ``-a "request_memory = 8000"`` to override a submit command.
        """
        return ["bash", script_path, "--elsewhere-submit", *extra_args]

    def parse_submit(self, stdout: str) -> str:
        """``5 job(s) submitted to cluster 123.`` -> ``123`` (``123@5`` when the first index is 5)."""
        m = re.search(r"submitted to cluster (\d+)", stdout)
        if not m:
            raise protocol_error(
                self.name, "condor_submit output (expected 'submitted to cluster N')", stdout
            )
        first = re.search(r"^elsewhere-array: (\d+)-(\d+)\s*$", stdout, re.MULTILINE)
        if first and int(first.group(1)) != 0:
            return f"{m.group(1)}@{first.group(1)}"
        return m.group(1)

    # -- status -------------------------------------------------------------------------

    def build_status(self, job_ids: Sequence[str]) -> list[str]:
        """``condor_q CLUSTERS -af:t ATTRS``."""
        clusters = [split_array_first(j)[0].split(".")[0] for j in job_ids]
        return ["condor_q", *clusters, "-af:t", *ATTRIBUTES]

    def parse_status(self, stdout: str) -> dict[str, NativeStatus]:
        """Read tab-separated ``-af:t`` lines; ``undefined`` is a missing attribute."""
        out: dict[str, NativeStatus] = {}
        for line in stdout.splitlines():
            if not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 7 or not parts[0].strip().isdigit() or not parts[1].strip().isdigit():
                raise protocol_error(self.name, "condor_q -af:t line", line)
            parts += [""] * (len(ATTRIBUTES) - len(parts))
            cluster, proc, status, exit_text, by_signal, signal, idx, hold, remove = (
                p.strip() for p in parts[: len(ATTRIBUTES)]
            )
            nid = f"{cluster}.{proc}"
            index = parse_int(idx)
            out[nid] = self._status(
                nid,
                status,
                exit_text,
                by_signal,
                signal,
                hold,
                remove,
                cluster,
                index if index is not None else int(proc),
            )
        return out

    def _status(
        self,
        nid: str,
        status: str,
        exit_text: str,
        by_signal: str,
        signal: str,
        hold: str,
        remove: str,
        cluster: str,
        index: int,
    ) -> NativeStatus:
        state = self.states.get(status)
        native = STATUS_NAMES.get(status, status)
        exit_code = parse_int(exit_text)
        reason = ""
        if by_signal.lower() == "true":
            sig = parse_int(signal)
            exit_code = 128 + sig if sig is not None else exit_code
            reason = f"signal {signal}"
        if status == "4" and (exit_code or by_signal.lower() == "true"):
            state = TaskState.FAILED
        elif status == "5":
            reason = _defined(hold) or "held"
        elif status == "3":
            reason = _defined(remove)
            if WALLTIME_MARK in reason:
                state, reason = TaskState.FAILED, "TIMEOUT"
        return NativeStatus(nid, native, state, reason, exit_code, cluster, index)

    # -- accounting ---------------------------------------------------------------------

    def build_accounting(self, job_ids: Sequence[str]) -> list[str] | None:
        """``condor_history -constraint 'ClusterId == 1 || ...' -af:t ATTRS``."""
        clusters = [split_array_first(j)[0].split(".")[0] for j in job_ids]
        constraint = " || ".join(f"ClusterId == {c}" for c in clusters)
        return ["condor_history", "-constraint", constraint, "-af:t", *ATTRIBUTES]

    def parse_accounting(self, stdout: str) -> dict[str, NativeStatus]:
        """The same columns as condor_q; history lists newest first, so the first line wins."""
        out: dict[str, NativeStatus] = {}
        for line in stdout.splitlines():
            for nid, status in self.parse_status(line).items():
                out.setdefault(nid, status)
        return out

    # -- cancel -------------------------------------------------------------------------

    def build_cancel(self, ids: Sequence[str]) -> list[str]:
        """``condor_rm 123 124.3``."""
        return ["condor_rm", *(split_array_first(i)[0] for i in ids)]

    def cancel_ok(self, returncode: int, stderr: str, stdout: str = "") -> bool:
        """``Couldn't find/remove all jobs in cluster 123`` / ``Job 123.4 not found``: already gone."""
        if returncode == 0:
            return True
        done = ("marked for removal",)
        lines = [ln for ln in (stderr + "\n" + stdout).splitlines() if ln.strip()]
        problems = [ln for ln in lines if not any(d in ln for d in done)]
        gone = ("Couldn't find/remove", "not found", "already being removed")
        return bool(problems) and all(any(g in ln for g in gone) for ln in problems)

    # -- limits, ids, logs ----------------------------------------------------------------

    def build_max_array_size(self) -> list[str] | None:
        """``condor_config_val MAX_JOBS_PER_SUBMISSION``."""
        return ["condor_config_val", "MAX_JOBS_PER_SUBMISSION"]

    def parse_max_array_size(self, stdout: str) -> int | None:
        """The number condor_config_val prints; None when it is not set."""
        value = parse_int(stdout.strip().splitlines()[0]) if stdout.strip() else None
        return value if value and value > 0 else None

    def element_id(self, job_id: str, index: int) -> str:
        """``123`` + 4 -> ``123.4``; ``123@5`` + 7 -> ``123.2`` (procs count from 0)."""
        cluster, first = split_array_first(job_id)
        return f"{cluster}.{index - first}"

    def log_file(self, log_dir: str, job_name: str, job_id: str, index: int | None) -> str:
        """``LOG_DIR/NAME-CLUSTER_PROC.log``."""
        cluster, first = split_array_first(job_id)
        proc = 0 if index is None else index - first
        return f"{log_dir}/{job_name}-{cluster}_{proc}.log"


def _defined(value: str) -> str:
    return "" if value in ("undefined", "") else value
