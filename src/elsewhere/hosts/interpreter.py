"""Facts about a Python interpreter on a host, asked through a transport.

The host need not have elsewhere: the text of :mod:`elsewhere.hosts.probe` (standard
library only) goes there as ``python -c``, inside a prelude that old interpreters can
parse. An interpreter too old to run the probe (Python 2, or 3 before 3.7) still says
its version, so that ``doctor`` can say which interpreter to use instead. The probe runs
through the same command line as the workers (``python=``: a container runtime, ``module
load ...``), so what it says is what they will find.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from elsewhere.hosts import probe
from elsewhere.util.command import PythonCommand, PythonSpec
from elsewhere.util.errors import RemoteSetupError

if TYPE_CHECKING:
    from elsewhere.hosts.transport import Transport

__all__ = ["remote_python_info"]

# Python 2.7 and 3.x parse this; the probe itself needs 3.7 (dataclasses).
_PRELUDE = r"""
import json, platform, sys
if sys.version_info < (3, 7):
    sys.stdout.write("\n" + MARKER + json.dumps({
        "python_version": "%d.%d.%d" % tuple(sys.version_info[:3]),
        "executable": sys.executable,
        "implementation": platform.python_implementation().lower(),
        "platform": sys.platform,
        "elsewhere_version": None,
    }) + "\n")
else:
    exec(compile(SOURCE, "<elsewhere probe>", "exec"), {"__name__": "__main__"})
"""


@functools.lru_cache(maxsize=1)
def probe_script() -> str:
    """The ``python -c`` text that prints the host's :class:`~elsewhere.hosts.probe.HostProbe`."""
    with open(probe.__file__, encoding="utf-8") as f:
        source = f.read()
    # ascii(): the literal is plain ASCII whatever the docstrings hold, for any locale there
    return _PRELUDE.replace("MARKER", json.dumps(probe.MARKER)).replace("SOURCE", ascii(source))


def remote_python_info(
    transport: Transport, python: PythonSpec = "python3", *, timeout: float = 60.0
) -> dict[str, Any]:
    """Ask ``python`` on the transport's host about itself and the machine.

    ``python`` is a ``python=`` value (:class:`~elsewhere.util.command.PythonCommand`): an
    interpreter, or a command line that ends in one (``"apptainer exec img.sif python3"``,
    ``"module load python && python3"``); the probe runs through all of it.

    One small script, one round trip. Returns the probe's dict
    (:meth:`~elsewhere.hosts.probe.HostProbe.to_dict`): ``python_version``,
    ``executable``, ``implementation``, ``platform``, ``machine``, ``hostname``,
    ``elsewhere_version`` (None when elsewhere cannot be imported there),
    ``cpu_count``, ``usable_cores`` (also as ``cpus_usable``), ``free_cores``,
    ``cpu_quota``, ``load_average`` (three floats, or None), ``mem_available_mb`` and
    ``mem_total_mb`` (None where unknown). An interpreter older than 3.7 answers only
    ``python_version``, ``executable``, ``implementation``, ``platform`` and
    ``elsewhere_version`` (None).

    Raises:
        ConfigError: ``python`` is no command line (empty, unbalanced quotes).
        RemoteSetupError: that interpreter is missing or fails; the message names
            the host and the interpreter.
    """
    cmd = PythonCommand.parse(python)
    python = cmd.text
    command = cmd.argv("-c", probe_script())
    shown = cmd.argv("-c", "<elsewhere python info>")
    result = transport.run(command, check=False, timeout=timeout)
    stderr = result.stderr.decode("utf-8", "replace")
    if result.returncode in (126, 127):
        raise RemoteSetupError(
            cmd.not_found(transport.host),
            host=transport.host,
            command=shown,
            returncode=result.returncode,
            stderr=stderr,
        )
    if result.returncode != 0:
        raise RemoteSetupError(
            f"Python {python!r} on {transport.host} failed to describe itself",
            host=transport.host,
            command=shown,
            returncode=result.returncode,
            stderr=stderr,
        )
    # login scripts may print banners to stdout: take the last marked line
    for line in reversed(result.text.splitlines()):
        if line.startswith(probe.MARKER):
            try:
                info = json.loads(line[len(probe.MARKER) :])
            except ValueError:
                break
            if isinstance(info, dict):
                return info
            break
    raise RemoteSetupError(
        f"Python {python!r} on {transport.host} gave no readable answer "
        "(does a login script print to stdout, or is this not CPython?)",
        host=transport.host,
        command=shown,
        returncode=result.returncode,
        stderr=stderr + result.text[-500:],
    )
