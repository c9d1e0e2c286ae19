"""The part of a job's queue that its workers' membership is: join, the state of each member
and its claim, workers on their way (dispatched, started by whom, lost at start), the members
the copies of the job on other machines report. A mixin of :class:`~.queue.Queue`, whose one
owner of the queue state it stays (``queue.py``); the transitions of ``run/claims.py``.

This module is imported by the worker: keep its imports light.
"""

from __future__ import annotations

TYPE_CHECKING = False  # no typing at run time: the worker imports this module
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from ..util.errors import StateError

__all__ = ["Members", "refuse"]

_MEMBER_STATES = ("active", "waiting", "left", "dead")


def refuse(message: str) -> StateError:
    """The StateError of a transition the queue's state does not allow."""
    from ..util.errors import StateError  # here, not at the top: the worker never needs it

    return StateError(message)


class Members:
    """A worker's membership and claims, as transitions of the queue state ``d``."""

    __slots__ = ()

    if TYPE_CHECKING:
        d: dict[str, Any]

        @property
        def members(self) -> dict[str, dict[str, Any]]: ...
        @property
        def next(self) -> int: ...
        @property
        def n(self) -> int: ...

    def join(self, wid: str, info: dict[str, Any]) -> dict[str, Any]:
        """Worker ``wid`` becomes a member (``info``: pid, host, python, lock, fifo, ...),
        active with nothing claimed yet; its member entry."""
        m = {**info, "claim": [], "state": "active", "claimed": False}
        self.members[wid] = m
        self.d.pop("start_losses", None)
        return m

    def set_member(self, wid: str, state: str, claim: list[int] | None = None) -> None:
        """Member ``wid`` is now ``state`` ("active", "waiting", "left" or "dead"), with
        ``claim`` (``[a, b]``: tasks a..b-1; ``[-1, i, j, ...]``: those), if given."""
        if state not in _MEMBER_STATES:
            raise refuse(f"a member is {', '.join(_MEMBER_STATES)}, not {state!r}")
        m = self.members[wid]
        m["state"] = state
        if claim is not None:
            m["claim"] = claim
            if claim:
                m["claimed"] = True  # it ran (or runs) tasks: it has a journal

    def take_next(self, k: int) -> int:
        """Claim the next ``k`` tasks never claimed: returns the first (the tasks are
        ``first .. first + k - 1``)."""
        a = self.next
        if k < 0 or a + k > self.n:
            raise refuse(f"cannot claim {k} tasks from {a}: the job has {self.n}")
        self.d["next"] = a + k
        return a

    def note_dispatched(self, wids: Iterable[str], when: float) -> None:
        """Workers handed this job, not yet joined (a worker's start-up is not a loss)."""
        d = self.d.setdefault("dispatched", {})
        for w in wids:
            d[w] = when

    def dispatched(self) -> dict[str, float]:
        """Workers handed this job that have not joined yet: ``{worker id: since}``."""
        return dict(self.d.get("dispatched", {}))

    def forget_dispatched(self, wid: str) -> None:
        """Worker ``wid`` joined, or will never."""
        self.d.get("dispatched", {}).pop(wid, None)
        self.d.get("started_by", {}).pop(wid, None)

    def note_started(self, wids: Iterable[str], pid: int, host: str) -> None:
        """Workers ``wids`` on their way come from process ``pid`` on ``host`` (the one
        started, which forks the others): if it is gone before they join, so are they."""
        d = self.d.setdefault("started_by", {})
        for w in wids:
            if w in self.d.get("dispatched", {}):
                d[w] = [pid, host]

    def lost_at_start(self, wid: str) -> int:
        """Worker ``wid``, on its way, ended before it joined: forgotten. Returns how many in
        a row did so (a worker that joins starts the count again)."""
        self.forget_dispatched(wid)
        n = self.d["start_losses"] = int(self.d.get("start_losses", 0)) + 1
        return n

    def started_by(self, wid: str) -> tuple[int, str] | None:
        """(pid, host) of the process that starts worker ``wid`` on its way, if known."""
        got = self.d.get("started_by", {}).get(wid)
        return (int(got[0]), str(got[1])) if got else None

    def adopt(
        self,
        *,
        members: dict[str, dict[str, Any]],
        lost_by: dict[str, str],
        lost_reason: dict[str, str],
        lost_ranges: list[list[Any]] | None = None,
    ) -> None:
        """Take in what the queues of the job's copies on other machines say of their workers
        and lost tasks (the ssh backend: each node runs its share from a queue of its own;
        ``lost_ranges``: a node's ``d["lost_ranges"]``, tasks its failed workers wrote off)."""
        self.members.update(members)
        if lost_by:
            self.d.setdefault("lost_by", {}).update(lost_by)
        if lost_reason:
            self.d.setdefault("lost_reason", {}).update(lost_reason)
        if lost_ranges:
            have = self.d.setdefault("lost_ranges", [])
            have += [list(r) for r in lost_ranges if list(r) not in have]
