"""Commands and files across machines: this one, or a host reached by OpenSSH.

The rest of elsewhere reaches other machines only through a
:class:`Transport` (see :mod:`elsewhere.hosts.transport` for the contract):

>>> from elsewhere.hosts import SSHTransport
>>> with SSHTransport("user@login.cluster.org") as host:       # doctest: +SKIP
...     host.run(["squeue", "--me"]).text
"""

from __future__ import annotations

from elsewhere.hosts.local import LocalTransport
from elsewhere.hosts.session import AgentSession, agent_error
from elsewhere.hosts.ssh import (
    SSHTransport,
    build_remote_command,
    build_rsync_rsh,
    parse_ssh_failure,
)
from elsewhere.hosts.transport import (
    BaseTransport,
    CommandFailed,
    CommandTimeout,
    CompletedCommand,
    Transport,
    remote_python_info,
)

__all__ = [
    "AgentSession",
    "BaseTransport",
    "CommandFailed",
    "CommandTimeout",
    "CompletedCommand",
    "LocalTransport",
    "SSHTransport",
    "Transport",
    "agent_error",
    "build_remote_command",
    "build_rsync_rsh",
    "parse_ssh_failure",
    "remote_python_info",
]
