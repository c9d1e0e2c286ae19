"""Flux: flux submit --cc, flux jobs, flux cancel.

Flux has no job arrays: ``flux submit --cc=IDSET`` submits one job per id,
each with ``FLUX_JOB_CC`` set to its id, and prints one job id per line.
``flux submit`` reads no directives from a script (only ``flux batch`` does,
and ``flux batch`` has no ``--cc``), so the rendered script is
self-submitting: ``bash SCRIPT --elsewhere-submit [flux submit options]``
prints ``elsewhere-array: FIRST-LAST`` and execs ``flux submit --cc=FIRST-LAST
[the template's options] [extra] /bin/bash SCRIPT``. A communicating job is
``flux batch -n RANKS`` instead, whose script then runs ``flux run``.

The job id elsewhere keeps for a submission is the list of its element ids,
ordered by id (Flux ids grow with submission time, so that is the ``--cc``
order), comma-separated, with ``@FIRST`` appended when the first index is
not 0: ``"ƒAb1,ƒAb2,ƒAb3@5"``. :meth:`FluxSyntax.element_id` picks one out.

Status and accounting: ``flux jobs -a -n -o
"{id.f58}|{status}|{returncode}|{exception.type}|{exception.note}" IDS`` (Flux
keeps inactive jobs in its job list until they are purged). ``{status}`` is
PENDING/RUNNING/COMPLETED/FAILED/CANCELED/TIMEOUT in older Flux, and
DEPEND/PRIORITY/SCHED/RUN/CLEANUP/COMPLETED/... in newer Flux; both map.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from elsewhere.schedulers.context import ScriptContext
from elsewhere.schedulers.indices import split_array_first
from elsewhere.schedulers.status import NativeStatus, parse_int, protocol_error
from elsewhere.schedulers.syntax import BatchSyntax
from elsewhere.util.states import TaskState

__all__ = ["FluxSyntax", "decode_f58", "encode_f58"]

FLUX_STATES: Mapping[str, TaskState] = MappingProxyType(
    {
        "NEW": TaskState.QUEUED,
        "DEPEND": TaskState.QUEUED,
        "PRIORITY": TaskState.QUEUED,
        "SCHED": TaskState.QUEUED,
        "PENDING": TaskState.QUEUED,
        "RUN": TaskState.RUNNING,
        "CLEANUP": TaskState.RUNNING,
        "RUNNING": TaskState.RUNNING,
        "COMPLETED": TaskState.FINISHED,
        "FAILED": TaskState.FAILED,
        "TIMEOUT": TaskState.FAILED,
        "CANCELED": TaskState.CANCELLED,
        "CANCELLED": TaskState.CANCELLED,
    }
)

JOBS_FORMAT = "{id.f58}|{status}|{returncode}|{exception.type}|{exception.note}"

_F58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_F58_PREFIXES = ("ƒ", "f")


def decode_f58(job_id: str) -> int:
    """The integer of a Flux job id: F58 (``ƒAb1`` or ASCII ``fAb1``), decimal or ``0x`` hex."""
    text = job_id.strip()
    if text.isdigit():
        return int(text)
    if text.startswith("0x"):
        return int(text, 16)
    for prefix in _F58_PREFIXES:
        if text.startswith(prefix) and len(text) > len(prefix):
            value = 0
            for ch in text[len(prefix) :]:
                digit = _F58_ALPHABET.find(ch)
                if digit < 0:
                    raise ValueError(f"not a Flux job id: {job_id!r}")
                value = value * 58 + digit
            return value
    raise ValueError(f"not a Flux job id: {job_id!r}")


def encode_f58(value: int, prefix: str = "ƒ") -> str:
    """The F58 form of a Flux job id (``prefix`` ``"f"`` for ASCII)."""
    if value < 0:
        raise ValueError("job ids are not negative")
    digits = ""
    while True:
        value, rest = divmod(value, 58)
        digits = _F58_ALPHABET[rest] + digits
        if value == 0:
            break
    return prefix + digits


class FluxSyntax(BatchSyntax):
    """Flux "arrays" of ``flux submit --cc`` copies; status by ``flux jobs``."""

    name = "flux"
    submit_command = "flux"
    status_command = "flux"
    cancel_command = "flux"
    array_index_var = "FLUX_JOB_CC"
    array_index_base = 0
    default_max_array_size = 10000
    states = FLUX_STATES
    directive_prefix = ""
    mpi_launcher = "flux run"

    def template_vars(self, ctx: ScriptContext) -> dict[str, object]:
        """``flux_output``: the ``--output`` template (Flux's own ``{{id.dec}}`` and ``{cc}``)."""
        suffix = "{{id.dec}}.log" if ctx.communicating else "{{id.dec}}_{cc}.log"
        return {"flux_output": f"{ctx.log_dir}/{ctx.job_name}-{suffix}"}

    # -- submit -----------------------------------------------------------------------

    def build_submit(self, script_path: str, extra_args: Sequence[str] = ()) -> list[str]:
        """``bash SCRIPT --elsewhere-submit [extra]``: the script runs ``flux submit``.

        ``extra`` goes to flux submit after the template's options, so it wins.
        """
        return ["bash", script_path, "--elsewhere-submit", *extra_args]

    def parse_submit(self, stdout: str) -> str:
        """The element ids, ordered, comma-joined, ``@FIRST`` when FIRST is not 0."""
        ids: list[tuple[int, str]] = []
        first = 0
        expected: int | None = None
        for line in stdout.splitlines():
            text = line.strip()
            if not text:
                continue
            m = re.fullmatch(r"elsewhere-array: (\d+)-(\d+)", text)
            if m:
                first, expected = int(m.group(1)), int(m.group(2)) - int(m.group(1)) + 1
                continue
            try:
                ids.append((decode_f58(text), text))
            except ValueError:
                raise protocol_error(
                    self.name, "flux submit output (expected job ids)", stdout
                ) from None
        if not ids:
            raise protocol_error(self.name, "flux submit output (no job id)", stdout)
        if expected is not None and len(ids) != expected:
            raise protocol_error(
                self.name, f"flux submit output ({len(ids)} job ids for {expected} copies)", stdout
            )
        joined = ",".join(text for _, text in sorted(ids))
        return f"{joined}@{first}" if first else joined

    def build_dependency(self, job_ids: Sequence[str]) -> list[str] | None:
        """``--dependency=afterok:ID`` for each element of each job (a submission's id holds
        its elements' ids)."""
        words = [f"--dependency=afterok:{e}" for i in job_ids for e in self.element_ids(i)]
        return words or None

    def element_ids(self, job_id: str) -> list[str]:
        """Every element id of a submission's job id."""
        ids, _ = split_array_first(job_id)
        return [i for i in ids.split(",") if i]

    # -- status -----------------------------------------------------------------------

    def build_status(self, job_ids: Sequence[str]) -> list[str]:
        """``flux jobs -a -n -o FORMAT IDS`` with every element id of every job."""
        ids = [e for j in job_ids for e in self.element_ids(j)]
        return ["flux", "jobs", "-a", "-n", "-o", JOBS_FORMAT, *ids]

    def status_ok(self, returncode: int, stderr: str) -> bool:
        """A purged or unknown id is reported on stderr; the others are still listed."""
        if returncode == 0:
            return True
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        return bool(lines) and all("not found" in ln or "unknown" in ln.lower() for ln in lines)

    def parse_status(self, stdout: str) -> dict[str, NativeStatus]:
        """Read ``id|status|returncode|exception.type|exception.note`` lines."""
        out: dict[str, NativeStatus] = {}
        for line in stdout.splitlines():
            if not line.strip():
                continue
            parts = line.strip().split("|", 4)
            if len(parts) != 5:
                raise protocol_error(self.name, "flux jobs line (expected 5 fields)", line)
            nid, native_state, rc_text, exc_type, exc_note = (p.strip() for p in parts)
            try:
                decode_f58(nid)
            except ValueError:
                raise protocol_error(self.name, f"flux jobs id {nid!r}", line) from None
            state = self.states.get(native_state)
            exit_code = parse_int(rc_text)
            reason = ""
            if native_state == "TIMEOUT":
                reason = "TIMEOUT"
            elif exc_type and state in (TaskState.FAILED, TaskState.CANCELLED):
                reason = f"{exc_type}: {exc_note}" if exc_note else exc_type
            out[nid] = NativeStatus(nid, native_state, state, reason, exit_code, nid, None)
        return out

    def build_accounting(self, job_ids: Sequence[str]) -> list[str] | None:
        """The same ``flux jobs -a``: inactive jobs stay listed until purged."""
        return self.build_status(job_ids)

    # -- cancel -------------------------------------------------------------------------

    def build_cancel(self, ids: Sequence[str]) -> list[str]:
        """``flux cancel IDS`` with every element id of each job id given."""
        return ["flux", "cancel", *(e for i in ids for e in self.element_ids(i))]

    def cancel_ok(self, returncode: int, stderr: str, stdout: str = "") -> bool:
        """``job is inactive`` / unknown id: already gone."""
        if returncode == 0:
            return True
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        gone = ("inactive", "unknown", "not found")
        return bool(lines) and all(any(g in ln.lower() for g in gone) for ln in lines)

    # -- ids, logs ----------------------------------------------------------------------

    def element_id(self, job_id: str, index: int) -> str:
        """The id of copy ``index`` (FIRST + position in the ordered list)."""
        ids = self.element_ids(job_id)
        _, first = split_array_first(job_id)
        position = index - first
        if len(ids) == 1 and position == 0:
            return ids[0]
        if not 0 <= position < len(ids):
            raise IndexError(
                f"flux: index {index} is not in job {job_id!r} (first {first}, {len(ids)} copies)"
            )
        return ids[position]

    def log_file(self, log_dir: str, job_name: str, job_id: str, index: int | None) -> str:
        """``LOG_DIR/NAME-ELEMENT_INDEX.log``, the element id in decimal (``NAME-ID.log``
        for a communicating job)."""
        if index is None:
            return f"{log_dir}/{job_name}-{decode_f58(self.element_ids(job_id)[0])}.log"
        return f"{log_dir}/{job_name}-{decode_f58(self.element_id(job_id, index))}_{index}.log"
