"""Son of Grid Engine / Univa / Open Cluster Scheduler: qsub, qstat, qacct, qdel, qconf.

Status is read from ``qstat -xml``: XML is stable where the column layout of
plain ``qstat`` shifts with name lengths and dates. In it, a running array
task is its own ``job_list`` entry with ``<tasks>4</tasks>``; the pending
rest of the array is one entry whose ``tasks`` is a range such as ``5-10:1``
(or ``5,7,9-10:1``); the parser expands it. A job that is not an array has no
``tasks`` element.

Finished jobs leave qstat at once; ``qacct -j ID`` (one id per call, so
several ids become a short shell loop) reads the accounting file, one block
per task. A queue's slots come from the cluster queue summary, ``qstat -g c``.
"""

from __future__ import annotations

import re
import shlex
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from elsewhere.schedulers.capacity import FreeCpus
from elsewhere.schedulers.indices import expand_indices
from elsewhere.schedulers.status import NativeStatus, parse_int, protocol_error
from elsewhere.schedulers.syntax import BatchSyntax
from elsewhere.util.signals import killed_by
from elsewhere.util.states import TaskState

__all__ = ["SGESyntax"]

Q, R, F, X, C = (
    TaskState.QUEUED,
    TaskState.RUNNING,
    TaskState.FINISHED,
    TaskState.FAILED,
    TaskState.CANCELLED,
)

#: qstat state letters -> TaskState. Combinations not listed are read letter by
#: letter (see ``SGESyntax.state_of``): E (error) wins, then d (deletion), then
#: r/t/R/s/S/T (started), then q/w/h (waiting).
SGE_STATES: Mapping[str, TaskState] = MappingProxyType(
    {
        "qw": Q,
        "hqw": Q,
        "hRwq": Q,
        "Rq": Q,
        "r": R,
        "t": R,
        "Rr": R,
        "Rt": R,
        "s": R,
        "ts": R,
        "S": R,
        "tS": R,
        "T": R,
        "tT": R,
        "Rs": R,
        "Rts": R,
        "RS": R,
        "RtS": R,
        "RT": R,
        "RtT": R,
        "Eqw": X,
        "Ehqw": X,
        "EhRqw": X,
        "dr": C,
        "dt": C,
        "dRr": C,
        "dRt": C,
        "ds": C,
        "dS": C,
        "dT": C,
        "dRs": C,
        "dRS": C,
        "dRT": C,
        "dqw": C,
        "dhqw": C,
    }
)


class SGESyntax(BatchSyntax):
    """Grid Engine array jobs (``qsub -t``), status by ``qstat -xml``, history by qacct."""

    name = "sge"
    submit_command = "qsub"
    status_command = "qstat"
    cancel_command = "qdel"
    array_index_var = "SGE_TASK_ID"
    array_index_base = 1
    default_max_array_size = 75000
    states = SGE_STATES
    directive_prefix = "#$ "
    mpi_launcher = "mpirun"

    # -- submit -------------------------------------------------------------------

    def build_submit(self, script_path: str, extra_args: Sequence[str] = ()) -> list[str]:
        """``qsub -terse [extra] script``: command-line options override ``#$`` lines."""
        return ["qsub", "-terse", *extra_args, script_path]

    #: ``-hold_jid`` waits for the jobs' end, however they ended: the waiting job's workers
    #: check that they finished OK before they run anything (``backends/dependency.py``)
    dependency_checks_outcome = False

    def build_dependency(self, job_ids: Sequence[str]) -> list[str] | None:
        """``-hold_jid ID[,ID]``. Grid Engine starts the job once those jobs ended, however they
        ended: its workers check that they finished OK first (``dependency_checks_outcome``)."""
        return ["-hold_jid", ",".join(job_ids)] if job_ids else None

    def parse_submit(self, stdout: str) -> str:
        """``123`` or ``123.1-5:1`` (-terse), or ``Your job(-array) 123...`` -> ``123``."""
        for line in reversed(stdout.strip().splitlines()):
            m = re.fullmatch(r"\s*(\d+)(?:\.\d+-\d+:\d+)?\s*", line)
            if m:
                return m.group(1)
            m = re.search(r"Your job(?:-array)? (\d+)", line)
            if m:
                return m.group(1)
        raise protocol_error(self.name, "qsub output (expected a job id)", stdout)

    # -- status ---------------------------------------------------------------------

    def build_status(self, job_ids: Sequence[str]) -> list[str]:
        """``qstat -xml``: the current user's jobs (qstat lists by user, not by id)."""
        return ["qstat", "-xml"]

    def state_of(self, native_state: str) -> TaskState | None:
        """Table first, then by letters: E, d, started, waiting."""
        known = self.states.get(native_state)
        if known is not None or not native_state:
            return known
        letters = set(native_state)
        if "E" in letters:
            return X
        if "d" in letters:
            return C
        if letters & set("rtRsST") and not letters & set("qw"):
            return R
        if letters & set("qwh"):
            return Q
        return None

    def parse_status(self, stdout: str) -> dict[str, NativeStatus]:
        """Read ``qstat -xml``; a pending task range becomes one status per task."""
        if not stdout.strip():
            return {}
        try:
            root = ET.fromstring(stdout.strip())
        except ET.ParseError as exc:
            raise protocol_error(self.name, f"qstat -xml output ({exc})", stdout) from None
        out: dict[str, NativeStatus] = {}
        for entry in root.iter("job_list"):
            job_id = (entry.findtext("JB_job_number") or "").strip()
            native_state = (entry.findtext("state") or "").strip()
            if not job_id.isdigit() or not native_state:
                raise protocol_error(
                    self.name, "qstat -xml job_list entry", ET.tostring(entry, "unicode")
                )
            state = self.state_of(native_state)
            reason = _reason(native_state)
            tasks = (entry.findtext("tasks") or "").strip()
            if not tasks:
                out[job_id] = NativeStatus(job_id, native_state, state, reason, None, job_id, None)
                continue
            try:
                indices = expand_indices(tasks)
            except ValueError:
                raise protocol_error(self.name, f"task range {tasks!r}", stdout) from None
            for i in indices:
                nid = f"{job_id}.{i}"
                out[nid] = NativeStatus(nid, native_state, state, reason, None, job_id, i)
        return out

    # -- accounting ---------------------------------------------------------------------

    def build_accounting(self, job_ids: Sequence[str]) -> list[str] | None:
        """``qacct -j ID`` (one id); several ids become ``sh -c 'for j ...; do qacct -j $j; done'``."""
        ids = [str(j) for j in job_ids]
        if len(ids) == 1:
            return ["qacct", "-j", ids[0]]
        loop = "for j in " + " ".join(shlex.quote(j) for j in ids)
        return ["sh", "-c", loop + '; do qacct -j "$j"; done; exit 0']

    def parse_accounting(self, stdout: str) -> dict[str, NativeStatus]:
        """Read qacct blocks (``key value`` lines between ``====`` rulers), one per task."""
        out: dict[str, NativeStatus] = {}
        for block in re.split(r"^=+\s*$", stdout, flags=re.MULTILINE):
            fields: dict[str, str] = {}
            for line in block.splitlines():
                key, _, value = line.strip().partition(" ")
                if key:
                    fields[key] = value.strip()
            if "jobnumber" not in fields:
                continue
            job_id = fields["jobnumber"]
            if not job_id.isdigit():
                raise protocol_error(self.name, "qacct jobnumber", block)
            index = parse_int(fields.get("taskid", ""))
            nid = job_id if index is None else f"{job_id}.{index}"
            status = self._accounting_status(nid, job_id, index, fields)
            out[nid] = status
        return out

    def _accounting_status(
        self, nid: str, job_id: str, index: int | None, fields: dict[str, str]
    ) -> NativeStatus:
        failed_text = fields.get("failed", "0")
        failed = parse_int(failed_text.split(":", 1)[0]) or 0
        # "exit_status  137                  (Killed)"
        exit_words = fields.get("exit_status", "").split()
        exit_code = parse_int(exit_words[0]) if exit_words else None
        native = f"failed={failed_text} exit_status={' '.join(exit_words)}"
        deleted_by = fields.get("deleted_by", "NONE")  # Univa/Altair GE record it; SGE 8.1 does not
        if deleted_by not in ("", "NONE"):
            return NativeStatus(
                nid, native, C, f"deleted by {deleted_by}", exit_code, job_id, index
            )
        if failed == 0 and exit_code == 0:
            return NativeStatus(nid, native, F, "", 0, job_id, index)
        reason = ""
        if failed:
            reason = f"failed {failed_text}"
        if exit_code is not None and exit_code > 128:
            # SIGKILL/SIGTERM: a qdel of a running task and an exceeded h_rt or
            # h_vmem look the same here; whoever cancelled knows it was them.
            number = exit_code - 128
            reason = killed_by(number, "qdel, or a limit such as h_rt" if number in (9, 15) else "")
        if failed in (37, 38) or "h_rt" in failed_text:
            reason = "TIMEOUT"
        return NativeStatus(nid, native, X, reason, exit_code, job_id, index)

    def accounting_ok(self, returncode: int, stderr: str) -> bool:
        """qacct says "job id N not found" for a job not (yet) accounted."""
        return returncode == 0 or "not found" in stderr

    # -- cancel -------------------------------------------------------------------------

    def build_cancel(self, ids: Sequence[str]) -> list[str]:
        """``qdel 123 124.4``: qdel takes ``job.task`` element ids as they are."""
        return ["qdel", *ids]

    def cancel_ok(self, returncode: int, stderr: str, stdout: str = "") -> bool:
        """``denied: job "123" does not exist`` means it is already gone.

        qdel prints its messages on stdout, so pass it too.
        """
        if returncode == 0:
            return True
        lines = [ln for ln in (stderr + "\n" + stdout).splitlines() if ln.strip()]
        denied = [ln for ln in lines if "denied" in ln or "error" in ln.lower()]
        return bool(denied) and all("does not exist" in ln for ln in denied)

    # -- limits, ids, logs ----------------------------------------------------------------

    def build_max_array_size(self) -> list[str] | None:
        """``qconf -sconf`` (max_aj_tasks)."""
        return ["qconf", "-sconf"]

    def parse_max_array_size(self, stdout: str) -> int | None:
        """``max_aj_tasks 75000``; 0 means no limit (None)."""
        m = re.search(r"^\s*max_aj_tasks\s+(\d+)", stdout, re.MULTILINE)
        if not m:
            return None
        value = int(m.group(1))
        return value or None

    def build_free_cpus(self, queue: str | None) -> list[str] | None:
        """``qstat -g c``: the cluster queue summary (slots used, reserved, available)."""
        return ["qstat", "-g", "c"]

    def parse_free_cpus(self, stdout: str, queue: str | None) -> FreeCpus | None:
        """Read the summary by its header (``CLUSTER QUEUE CQLOAD USED RES AVAIL TOTAL
        aoACDS cdsuE``; older versions have no ``RES``): idle slots are ``AVAIL``, usable ones
        ``USED + RES + AVAIL`` (the rest are in alarm, suspended, disabled or in error). The
        queue named ``queue`` (``all.q``, or ``all.q@host``: its cluster queue), else every
        queue listed. None if the header or the queue is not there."""
        lines = [ln.split() for ln in stdout.splitlines() if ln.strip() and not ln.startswith("-")]
        if not lines or lines[0][:2] != ["CLUSTER", "QUEUE"]:
            return None
        columns = lines[0][2:]
        if not {"USED", "AVAIL"} <= set(columns):
            return None
        want = queue.split("@", 1)[0] if queue else None
        total: FreeCpus | None = None
        for words in lines[1:]:
            if len(words) != len(columns) + 1 or (want is not None and words[0] != want):
                continue
            row = dict(zip(columns, words[1:]))
            counts = [parse_int(row.get(c, "0")) for c in ("USED", "RES", "AVAIL")]
            if any(c is None or c < 0 for c in counts):
                continue
            used, res, avail = (int(c or 0) for c in counts)
            got = FreeCpus(avail, used + res + avail)
            total = got if total is None else total + got
        return total

    def element_id(self, job_id: str, index: int) -> str:
        """``123`` + 4 -> ``123.4``."""
        return f"{job_id}.{index}"

    def log_file(self, log_dir: str, job_name: str, job_id: str, index: int | None) -> str:
        """``LOG_DIR/NAME-JOB.INDEX.log`` (``NAME-JOB.log`` for a communicating job)."""
        if index is None:
            return f"{log_dir}/{job_name}-{job_id}.log"
        return f"{log_dir}/{job_name}-{job_id}.{index}.log"


def _reason(native_state: str) -> str:
    if "E" in native_state:
        return "error state " + native_state
    if "d" in native_state:
        return "deleted by qdel"
    if "h" in native_state:
        return "held"
    if "s" in native_state or "S" in native_state or "T" in native_state:
        return "suspended"
    return ""
