"""The worker daemon's bookkeeping, in this process: no sockets but socketpairs."""

from __future__ import annotations

import os
import socket
import time

import pytest
from peer_testing import make_pair, pump

from elsewhere.peer.admission import Held, Peer
from elsewhere.peer.daemon import PeerWorker
from elsewhere.peer.keys import GroupKey
from elsewhere.peer.messages import Ask
from elsewhere.peer.options import WorkerOptions
from elsewhere.peer.runs import Run


def _peer_whose_sends_fail(asks: list[str]) -> Peer:
    """A controller's connection that has asked for ``asks``, and whose socket is broken:
    the next frame the worker sends it fails, and closing it is the daemon's answer."""
    ctrl, work = make_pair(GroupKey("g", os.urandom(32)))
    for tid in asks:
        ctrl.send(Ask(tid))
    pump(ctrl, work)
    ours, theirs = socket.socketpair()
    theirs.close()
    peer = Peer(ours, "127.0.0.1")
    peer.connect(work)
    peer.controller = "c1"
    return peer


@pytest.fixture
def worker() -> PeerWorker:
    return PeerWorker(WorkerOptions(slots=1, hold_s=1.0))


def test_refusing_expired_asks_of_a_connection_that_breaks_does_not_stop_the_worker(
        worker: PeerWorker) -> None:  # fmt: skip
    peer = _peer_whose_sends_fail(["a", "b", "c"])
    worker.peers.add(peer)
    worker.by_controller["c1"] = peer
    old = time.monotonic() - 10
    worker.admission.held = [Held(peer, Ask(t), old) for t in ("a", "b", "c")]
    worker._tick(time.monotonic())  # the first REFUSE fails: the connection and its ASKs go
    assert peer.closed and worker.admission.held == [] and "c1" not in worker.by_controller


def test_expiring_admissions_of_a_connection_that_breaks_does_not_stop_the_worker(
        worker: PeerWorker) -> None:  # fmt: skip
    broken = _peer_whose_sends_fail(["x", "z", "x2"])
    worker.peers.add(broken)
    worker.by_controller["c1"] = broken
    stale = time.monotonic() - 120  # accepted two minutes ago, their TASKs never came
    for tid in ("x", "z"):
        worker.admission.reserved[(id(broken), tid)] = Run(1, "c1", tid, Ask(tid), {}, accepted=stale)
    worker.admission.held = [Held(broken, Ask("x2"), time.monotonic())]
    # dropping "x" frees the slot for "x2"; its ACCEPT fails and closes the connection,
    # which drops "z" too, before the loop comes to it
    worker._tick(time.monotonic())
    assert broken.closed and worker.admission.reserved == {} and worker.admission.held == []


def test_controllers_gone_for_good_are_forgotten(worker: PeerWorker) -> None:
    # a worker up for weeks meets a controller per notebook session: it keeps none of them
    now = time.monotonic()
    for i in range(500):
        c = f"c{i}"
        worker.fair.started(c, i, now - 3600)
        worker.fair.finished(i, now - 3590)
        worker.gone_since[c] = now - 3590
    worker.fair.started("busy", 1000, now - 10)  # still running: kept
    worker.gone_since["recent"] = now - 5  # left a moment ago: its runs may still be orphaned
    worker._tick(now)
    assert set(worker.fair.snapshot(now)) == {"busy"}
    assert set(worker.gone_since) == {"recent"}
