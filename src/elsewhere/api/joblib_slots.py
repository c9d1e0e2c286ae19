"""How many calls a cluster runs at once: what ``n_jobs=-1`` means for the joblib backend.

=============  ===================================================================
cluster        slots
=============  ===================================================================
local          its usable cores // cores_per_task (``ew.local(cores=...)`` caps them)
peers          the slots of the workers heard on the network // cores_per_task
               (listens about one announcement interval, ~1.2 s)
SLURM          the partition's CPUs that are up (``sinfo``) // cores_per_task,
               at most ``max_running``
other batch    ``max_running``, else :data:`DEFAULT_SLOTS`
ssh            each node's cores (given, or its free cores) // cores_per_task
a plugin       ``max_workers()`` if the plugin bounds it, else :data:`DEFAULT_SLOTS`
=============  ===================================================================
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..util.errors import ElsewhereError, PeerError

if TYPE_CHECKING:
    from ..backends.base import Cluster

__all__ = ["DEFAULT_SLOTS", "cluster_slots", "parse_sinfo_cpus"]

DEFAULT_SLOTS = 32
"""The slots of a cluster that cannot say how many it has (a batch scheduler other than SLURM
without ``max_running``, a plugin): how many batches of calls joblib keeps in flight there."""

_UNBOUNDED = 1 << 30


def cluster_slots(cluster: Cluster, *, wait_for_workers_s: float = 10.0) -> int:
    """How many tasks ``cluster`` runs at once (see the module's table); at least 1."""
    from ..backends.batch import BatchCluster
    from ..backends.local import LocalCluster
    from ..backends.peer import PeerCluster
    from ..backends.ssh import SSHCluster

    if isinstance(cluster, LocalCluster):
        return max(1, cluster.max_workers(_UNBOUNDED))
    if isinstance(cluster, PeerCluster):
        return peer_slots(cluster, wait_for_workers_s)
    if isinstance(cluster, BatchCluster):
        return _batch_slots(cluster)
    if isinstance(cluster, SSHCluster):
        return _ssh_slots(cluster)
    n = cluster.max_workers(_UNBOUNDED)
    return max(1, n) if n < _UNBOUNDED else DEFAULT_SLOTS


def peer_slots(cluster: Any, wait_s: float) -> int:
    """The slots of the peer workers ``cluster`` reaches, heard on the network: every worker
    announces itself about once a second, so this listens that long (one interval and a
    half) once a first worker is heard, longer while more come (up to three intervals), and
    at most ``wait_s`` for the first one."""
    from ..peer.announce import PeerState
    from ..peer.discovery import Listener

    cfg = cluster.discovery
    need = cluster.cores_per_task

    def workers(peers: list[Any]) -> dict[str, int]:
        return {p.peer_id: p.announcement.slots // need for p in peers
                if p.announcement.state in (PeerState.IDLE, PeerState.BUSY) and p.announcement.slots >= need}  # fmt: skip

    t0 = time.monotonic()
    with Listener(cluster.group_key, cfg) as listener:
        if not listener.wait_for(lambda peers: bool(workers(peers)), timeout=wait_s):
            group = "(loopback only)" if cluster.group_key is None else repr(cluster.group_key.group)
            raise PeerError(
                f"no peer worker of group {group} with {need} core(s) was heard within {wait_s:g} s on "
                f"discovery port {cfg.port}: start one with `elsewhere peer worker` (`elsewhere peer list` "
                "shows those heard), wait longer with parallel_config(..., wait_for_workers_s=60), or give "
                "n_jobs=N to send the calls anyway (they wait for workers)"
            )  # fmt: skip
        heard = workers(listener.peers())
        until = max(t0, time.monotonic()) + 1.5 * cfg.interval_s
        last = t0 + 3 * cfg.interval_s
        while (left := min(until, last) - time.monotonic()) > 0:
            if listener.wait_for(lambda peers: bool(workers(peers).keys() - heard.keys()), timeout=left):
                heard.update(workers(listener.peers()))  # a newcomer: others may follow it
                until = time.monotonic() + cfg.interval_s
        heard.update(workers(listener.peers()))
    return max(1, sum(heard.values()))


def parse_sinfo_cpus(text: str, partition: str | None) -> int | None:
    """The CPUs that are up (allocated + idle) in ``partition`` (default: the default partition,
    marked ``*``) from the output of ``sinfo -h -o "%P %C"`` (``debug* 0/8/0/8``: allocated,
    idle, other, total); None if it is not there."""
    total: int | None = None
    for line in text.splitlines():
        words = line.split()
        if len(words) != 2:
            continue
        name, cpus = words
        if (partition is not None and name.rstrip("*") != partition) or (partition is None and not name.endswith("*")):
            continue
        try:
            allocated, idle, _other, _total = (int(x) for x in cpus.split("/"))
        except ValueError:
            continue
        total = (total or 0) + allocated + idle
    return total


def _batch_slots(cluster: Any) -> int:
    cap = cluster.max_running
    cpus = None
    if cluster.kind == "slurm":
        try:
            res = cluster.run_command(["sinfo", "-h", "-o", "%P %C"], check=True, timeout=30)
            cpus = parse_sinfo_cpus(res.text, cluster.queue)
        except ElsewhereError:
            cpus = None
    if cpus is None:
        return cap or DEFAULT_SLOTS
    slots = max(1, cpus // cluster.cores_per_task)
    return min(slots, cap) if cap else slots


def _ssh_slots(cluster: Any) -> int:
    total = 0
    for host, cores in cluster.nodes.items():
        if cores is None:
            try:
                cores = int(cluster.probe(host).get("free_cores") or 1)
            except ElsewhereError:
                cores = 1  # unreachable now: its tasks move to the others (host_timeout_s)
        total += max(1, cores // cluster.cores_per_task)
    return total
