"""The sshds inside the network-namespace test hosts (``ci/services/netns-sshd.sh``).

Like :mod:`services` (and built on its ``netns()`` probe), this module only looks: it
starts nothing, never raises and takes well under a second::

    import netns_ssh

    info = netns_ssh.netns_ssh()            # NetnsSshInfo | None
    if info is None:
        pytest.skip(netns_ssh.why_no_netns_ssh())
    h1 = info.hosts[0]                       # alias "h1", namespace "ew-h1", address 10.77.0.1
    subprocess.run(h1.command("ssh", "-F", str(info.config), "h2", "true"))

RULE: 10.77.0.0/24 exists only inside the namespaces; never send anything to it from the
root namespace. The probe keeps to it: it reads each sshd's listening sockets from
``/proc/PID/net/tcp`` (the table of that process's own namespace) instead of connecting.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import services

__all__ = ["NetnsSshHost", "NetnsSshInfo", "netns_ssh", "why_no_netns_ssh"]

_START = "ci/services/netns.sh && ci/services/netns-sshd.sh"


@dataclass(frozen=True)
class NetnsSshHost:
    """One test host with an sshd: ssh alias ``alias`` (h1, h2...) for ``address`` in
    namespace ``namespace``; its sshd runs as ``sshd_pid`` and logs to ``log``."""

    alias: str
    namespace: str
    address: str
    sshd_pid: int
    log: Path

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's namespace (needs root)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


@dataclass(frozen=True)
class NetnsSshInfo:
    """The hosts whose sshd runs, in order (h1 first); ``config`` is the client's ssh_config
    (aliases h1..hN, root, the key in ``directory``, strict host key checking)."""

    hosts: tuple[NetnsSshHost, ...]
    config: Path
    directory: Path

    def host(self, alias: str) -> NetnsSshHost:
        """The host of ``alias`` ("h2")."""
        for h in self.hosts:
            if h.alias == alias:
                return h
        raise KeyError(alias)


def _listening(pid: int, address: str, port: int = 22) -> bool:
    """``address:port`` is in LISTEN state in the network namespace of process ``pid``."""
    a = [int(x) for x in address.split(".")]
    want = f"{a[3]:02X}{a[2]:02X}{a[1]:02X}{a[0]:02X}:{port:04X}"  # little-endian, as the kernel prints
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(f[1] == want and f[3] == "0A" for f in (line.split() for line in lines) if len(f) > 3)


def _same_namespace(pid: int, namespace: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{namespace}").st_ino
    except OSError:
        return False


def _probe() -> tuple[NetnsSshInfo | None, str]:
    ns = services.netns()
    if ns is None:
        return None, services.why_no_netns()
    directory = Path(os.environ.get("ELSEWHERE_CI_NETNS_SSH_DIR", "/var/lib/elsewhere-ci/netns-ssh"))
    config = directory / "ssh_config"
    if not config.is_file():
        return None, f"the namespace sshds were never set up ({config} missing): run {_START} as root"
    hosts = []
    for h in ns.hosts:
        alias = "h" + h.name.removeprefix("ew-h")
        d = directory / alias
        if not (d / "sshd_config").is_file():
            return None, f"no sshd configured for {h.name} (hosts added since netns-sshd.sh last ran?): run {_START}"
        if not services._alive(d / "sshd.pid", "sshd"):
            return None, f"the sshd of {h.name} is not running: run {_START} as root"
        pid = int((d / "sshd.pid").read_text().split()[0])
        if not _same_namespace(pid, h.name):
            return None, f"the sshd of {h.name} (pid {pid}) lives in an old namespace: run {_START}"
        if not _listening(pid, h.address):
            return None, f"the sshd of {h.name} (pid {pid}) does not listen on {h.address}:22"
        hosts.append(NetnsSshHost(alias, h.name, h.address, pid, d / "sshd.log"))
    return NetnsSshInfo(tuple(hosts), config, directory), ""


def netns_ssh() -> NetnsSshInfo | None:
    """The namespace hosts with a running sshd each, or None (``why_no_netns_ssh()`` says why)."""
    try:
        return _probe()[0]
    except Exception:  # a probe never raises
        return None


def why_no_netns_ssh() -> str:
    """Why ``netns_ssh()`` is None; "" when every test host's sshd listens."""
    try:
        return _probe()[1]
    except Exception as exc:
        return f"probing the namespace sshds failed: {exc!r}"
