"""What a queue can run now: :class:`FreeCpus`, the answer of a syntax's free-CPU query.

A batch syntax may say how to ask its scheduler for a queue's CPUs
(``build_free_cpus``) and read the answer (``parse_free_cpus``); the batch backend sizes a
job's array from it (``elsewhere.backends.packing``). A syntax that cannot ask returns None
from ``build_free_cpus``, and the backend then sizes without it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FreeCpus"]


@dataclass(frozen=True)
class FreeCpus:
    """The CPUs of a queue (a SLURM partition, a Grid Engine cluster queue).

    Attributes:
        idle: CPUs that nothing runs on now: an element asked for now starts at once.
        usable: CPUs in service, idle or running jobs (not down, drained, disabled or in
            error): the most elements that could ever run at once.
    """

    idle: int
    usable: int

    def __post_init__(self) -> None:
        for name in ("idle", "usable"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"FreeCpus.{name} must be a non-negative integer, not {value!r}")
        if self.idle > self.usable:
            raise ValueError(f"FreeCpus: idle={self.idle} is more than usable={self.usable}")

    def __add__(self, other: FreeCpus) -> FreeCpus:
        return FreeCpus(self.idle + other.idle, self.usable + other.usable)
