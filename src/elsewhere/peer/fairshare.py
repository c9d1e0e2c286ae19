"""Fair share of one worker between several controllers, from measured use. Pure.

A worker keeps, per controller, a *decayed sum of the run time* that
controller's tasks used on it: each second of run time counts fully now and
half as much ``half_life_s`` later. Tasks still running count with the time
they have run so far. When a slot frees and several controllers wait, the
worker admits the one with the least use (ties: the least recent use, then
the oldest request). A controller with many short tasks thus gets a slot as
soon as one frees, instead of queueing behind a controller whose long tasks
would take every slot in turn (first come, first served).

::

    use(c, t) = sum over finished runs r of c:  seconds(r) * 2 ** (-(t - end(r)) / half_life)
              + sum over running runs r of c:   t - start(r)

``FairShare(enabled=False)`` admits in order of arrival (first come, first
served), for comparison. Time is passed in (``now``, any monotonic clock).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

__all__ = ["FairShare", "Waiting", "decay"]


def decay(value: float, elapsed_s: float, half_life_s: float) -> float:
    """``value`` after ``elapsed_s`` seconds of exponential decay with ``half_life_s``."""
    if elapsed_s <= 0 or value == 0:
        return value
    if half_life_s <= 0 or half_life_s == math.inf:
        return 0.0 if half_life_s <= 0 else value
    return value * 0.5 ** (elapsed_s / half_life_s)


@dataclass(frozen=True)
class Waiting:
    """A request waiting for a slot: whose it is and when it came."""

    controller: str
    arrival: float


@dataclass
class _Account:
    used: float = 0.0  # decayed finished run time, as of ``stamp``
    stamp: float = 0.0
    last_use: float = -math.inf  # when it last started or ended a run


class FairShare:
    """Decayed use per controller on one worker, and the choice of whom to admit next."""

    def __init__(self, half_life_s: float = 60.0, *, enabled: bool = True) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s!r}")
        self.half_life_s = float(half_life_s)
        self.enabled = enabled
        self._accounts: dict[str, _Account] = {}
        self._running: dict[Hashable, tuple[str, float]] = {}

    def started(self, controller: str, run: Hashable, now: float) -> None:
        """A run of ``controller`` (any hashable token) starts now."""
        self._running[run] = (controller, now)
        self._account(controller, now).last_use = now

    def finished(self, run: Hashable, now: float) -> float:
        """The run ended: charge its time to its controller; returns the seconds charged."""
        entry = self._running.pop(run, None)
        if entry is None:
            return 0.0
        controller, start = entry
        seconds = max(0.0, now - start)
        acc = self._account(controller, now)
        acc.used += seconds
        acc.last_use = now
        return seconds

    def use(self, controller: str, now: float) -> float:
        """The decayed run time of ``controller`` here, running runs included."""
        acc = self._accounts.get(controller)
        used = decay(acc.used, now - acc.stamp, self.half_life_s) if acc is not None else 0.0
        for c, start in self._running.values():
            if c == controller:
                used += max(0.0, now - start)
        return used

    def pick(self, waiting: Sequence[Waiting], now: float) -> int:
        """Index in ``waiting`` of the request to admit next; -1 if ``waiting`` is empty."""
        if not waiting:
            return -1
        if not self.enabled:
            return min(range(len(waiting)), key=lambda i: (waiting[i].arrival, i))
        uses: dict[str, float] = {}
        for w in waiting:
            if w.controller not in uses:
                uses[w.controller] = self.use(w.controller, now)

        def rank(i: int) -> tuple[float, float, float, int]:
            w = waiting[i]
            acc = self._accounts.get(w.controller)
            last = acc.last_use if acc is not None else -math.inf
            return (uses[w.controller], last, w.arrival, i)

        return min(range(len(waiting)), key=rank)

    def prune(self, now: float, *, below: float = 1e-3) -> None:
        """Forget controllers whose use has decayed to nothing and that run nothing."""
        running = {c for c, _ in self._running.values()}
        for c in [c for c in self._accounts if c not in running]:
            if self.use(c, now) < below:
                del self._accounts[c]

    def snapshot(self, now: float) -> dict[str, float]:
        """Use per known controller (for status displays and tests)."""
        names = set(self._accounts) | {c for c, _ in self._running.values()}
        return {c: self.use(c, now) for c in sorted(names)}

    def _account(self, controller: str, now: float) -> _Account:
        acc = self._accounts.get(controller)
        if acc is None:
            acc = self._accounts[controller] = _Account(stamp=now)
        else:
            acc.used = decay(acc.used, now - acc.stamp, self.half_life_s)
            acc.stamp = now
        return acc
