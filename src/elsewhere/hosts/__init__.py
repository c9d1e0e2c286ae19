"""Commands and files across machines: this one, or a host reached by OpenSSH.

The rest of elsewhere reaches other machines only through a
:class:`Transport` (see :mod:`elsewhere.hosts.transport` for the contract):

>>> from elsewhere.hosts import SSHTransport
>>> with SSHTransport("user@login.cluster.org") as host:       # doctest: +SKIP
...     host.run(["squeue", "--me"]).text

The rooms of this layer:

=================  ==============================================================
``transport``      the contract, and what both transports share
``local``          this machine as a transport
``ssh``            a host through the OpenSSH client (one master connection)
``openssh``        ssh's command lines and failure messages (pure)
``sshcopy``        files over ssh: rsync, else tar streams
``tree``           the tree code: walk, pack and unpack folders (runs on both sides)
``session``        a long-lived agent on a host, over one ssh session
``agent``          ``python -m elsewhere.hosts.agent``: the node's side of a session
``probe``          usable cores (affinity, cgroups), load, memory, Python, elsewhere
``interpreter``    the probe run by an interpreter on a host, through a transport
``spawn``          starting a detached Python here
``sync``           a job folder and its copy on a host: push up, pull back
``mpi``            MPI launchers
=================  ==============================================================

Names are loaded on first use, so that importing one room (``elsewhere.hosts.probe`` in the
peer worker, ``elsewhere.hosts.agent`` on a node) does not import the others.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from elsewhere.hosts.interpreter import remote_python_info
    from elsewhere.hosts.local import LocalTransport
    from elsewhere.hosts.openssh import (
        build_remote_command,
        build_rsync_rsh,
        describe_ssh_failure,
        parse_ssh_failure,
    )
    from elsewhere.hosts.probe import HostProbe, probe_host, usable_cores
    from elsewhere.hosts.session import AgentSession, agent_error
    from elsewhere.hosts.spawn import spawn_python, spawn_python_pid
    from elsewhere.hosts.ssh import SSHTransport
    from elsewhere.hosts.sync import WORKER_OUTPUT, JobCopy
    from elsewhere.hosts.transport import (
        BaseTransport,
        CommandFailed,
        CommandTimeout,
        CompletedCommand,
        Transport,
    )

_EXPORTS = {
    "AgentSession": "session",
    "BaseTransport": "transport",
    "CommandFailed": "transport",
    "CommandTimeout": "transport",
    "CompletedCommand": "transport",
    "HostProbe": "probe",
    "JobCopy": "sync",
    "LocalTransport": "local",
    "SSHTransport": "ssh",
    "Transport": "transport",
    "WORKER_OUTPUT": "sync",
    "agent_error": "session",
    "build_remote_command": "openssh",
    "build_rsync_rsh": "openssh",
    "describe_ssh_failure": "openssh",
    "parse_ssh_failure": "openssh",
    "probe_host": "probe",
    "remote_python_info": "interpreter",
    "spawn_python": "spawn",
    "spawn_python_pid": "spawn",
    "usable_cores": "probe",
}

__all__ = [
    "WORKER_OUTPUT",
    "AgentSession",
    "BaseTransport",
    "CommandFailed",
    "CommandTimeout",
    "CompletedCommand",
    "HostProbe",
    "JobCopy",
    "LocalTransport",
    "SSHTransport",
    "Transport",
    "agent_error",
    "build_remote_command",
    "build_rsync_rsh",
    "describe_ssh_failure",
    "parse_ssh_failure",
    "probe_host",
    "remote_python_info",
    "spawn_python",
    "spawn_python_pid",
    "usable_cores",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'elsewhere.hosts' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"elsewhere.hosts.{module}"), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
