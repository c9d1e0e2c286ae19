"""Commands and files across machines: this one, or a host reached by OpenSSH.

The rest of elsewhere reaches other machines only through a
:class:`Transport` (see :mod:`elsewhere.remote.transport` for the contract):

>>> from elsewhere.remote import SSHTransport
>>> with SSHTransport("user@login.cluster.org") as host:       # doctest: +SKIP
...     host.run(["squeue", "--me"]).text
"""

from __future__ import annotations

from elsewhere.remote.local import LocalTransport
from elsewhere.remote.session import AgentSession, agent_error
from elsewhere.remote.ssh import (
    SSHTransport,
    build_remote_command,
    build_rsync_rsh,
    parse_ssh_failure,
)
from elsewhere.remote.transport import (
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
