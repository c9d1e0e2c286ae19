"""What a worker daemon offers, to whom, and for how long: :class:`WorkerOptions`.

The options ``elsewhere peer worker`` builds from its arguments (see :mod:`.cli`)
for a :class:`~.daemon.PeerWorker`, and the figures of this machine they default
to (:func:`machine_memory`, the cores this process may run on).
"""

from __future__ import annotations

import getpass
import math
import socket
import sys
from dataclasses import dataclass, field

from .access import AccessRules
from .discovery import DiscoveryConfig
from .keys import LOOPBACK_HOST, GroupKey

__all__ = ["WorkerOptions", "machine_memory"]


def machine_memory() -> int:
    """Total memory of this machine, in bytes."""
    import psutil

    return int(psutil.virtual_memory().total)


def _machine_cores() -> int:
    """The cores this machine lets this process use (the host probe's count: affinity, cgroups)."""
    from ..hosts.probe import usable_cores

    return usable_cores()


@dataclass(frozen=True)
class WorkerOptions:
    """What a worker offers, to whom, and for how long.

    ``key`` None is loopback-only mode (127.0.0.1, same user only); ``more_keys``
    are further groups served by the same daemon (and its slots). Times are
    seconds (``math.inf``: no limit); ``memavail`` bytes (None: the machine's).
    ``timavail`` caps one task; ``maxtime`` the daemon's life; ``maxidle`` the
    time without work before it exits; ``maxnum`` the tasks it runs. The command line reads
    ``--memavail 8G``, ``--maxtime 8h`` with :mod:`elsewhere.util.units` (docs/units.md).

    ``poll_s``: after a frame or a child's message, the daemon keeps polling its
    sockets, awake, for this long (0: never), and a child its socket after each batch. The next step of a tiny task then
    finds it running and warm: a sleeping process takes tens of microseconds to
    wake, and its code then runs cold, several times slower. It yields the core
    to any process that wants it, polls only while a core is free (see
    :class:`~elsewhere.util.system.CoreWatch`), and sleeps as soon as a step takes longer.
    """

    key: GroupKey | None = None
    more_keys: tuple[GroupKey, ...] = ()  # further groups served (their controllers share the slots)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    bind: str | None = None
    port: int = 0
    slots: int = field(default_factory=_machine_cores)
    memavail: int | None = None
    timavail: float = math.inf
    maxtime: float = math.inf
    maxidle: float = math.inf
    maxnum: int | None = None
    access: AccessRules = field(default_factory=AccessRules)
    encrypt: bool = True
    """With a key: tasks and results encrypted on the wire (the default); False (``--no-encrypt``)
    serves only controllers that turned encryption off too (``encrypt=False``). Both ends must
    agree; nothing changes without a key (loopback only, clear text)."""
    fair_share: bool = True
    half_life_s: float = 60.0
    hold_s: float = 5.0
    poll_s: float = 0.002
    keep_results_s: float = 600.0
    orphan_s: float = 600.0  # a run whose controller is gone (no connection) this long is stopped
    listen_for_controllers: bool = True
    python: str = sys.executable
    host: str = field(default_factory=socket.gethostname)
    user: str = field(default_factory=getpass.getuser)
    stats_file: str | None = None

    def __post_init__(self) -> None:
        from ..util.errors import ConfigError

        if not isinstance(self.slots, int) or self.slots < 1:
            raise ConfigError(f"slots must be a positive integer, got {self.slots!r}")
        memavail = self.memavail
        if memavail is not None and (not isinstance(memavail, int) or isinstance(memavail, bool) or memavail < 0):
            # the options hold bytes; text such as "8G" is read once, by util.units.parse_size
            raise ConfigError(f"memavail is a number of bytes >= 0 (parse_size reads '8G'), got {memavail!r}")
        for name in ("timavail", "maxtime", "maxidle", "hold_s", "keep_results_s", "orphan_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.poll_s <= 1:
            raise ConfigError(f"poll_s (--busy-poll) must be 0 to 1 s (0 to 1000 ms), got {self.poll_s!r} s")
        if self.maxnum is not None and self.maxnum < 1:
            raise ConfigError(f"maxnum must be >= 1, got {self.maxnum!r}")
        groups = [k.group for k in self.group_keys()]
        if len(set(groups)) != len(groups):
            raise ConfigError(f"each group once: {', '.join(groups)}")
        if self.more_keys and self.key is None:
            raise ConfigError("more_keys need a key (loopback-only mode serves no group)")
        if self.key is None and self.bind not in (None, LOOPBACK_HOST):
            raise ConfigError(f"without a group key a worker listens on {LOOPBACK_HOST} only")

    def group_keys(self) -> list[GroupKey]:
        """The keys of every group served (none in loopback-only mode)."""
        return [self.key, *self.more_keys] if self.key is not None else []

    def bind_address(self) -> str:
        """The TCP address to listen on."""
        if self.key is None:
            return LOOPBACK_HOST
        return self.bind or self.discovery.interface or "0.0.0.0"
