"""CoreWatch: a busy-polling process (a peer daemon, its task processes) spins on only while
a core is free, by the running count of /proc/loadavg; once every core is wanted at two looks
in a row it sleeps instead."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from elsewhere.peer.childmsg import MessageReader
from elsewhere.util.system import CoreWatch


def _loadavg(path: Path, running: int) -> None:
    path.write_text(f"0.52 0.80 1.01 {running}/345 12345\n")


def test_a_core_is_free_while_the_runnable_threads_fit_on_the_cores(tmp_path: Path) -> None:
    path = tmp_path / "loadavg"
    _loadavg(path, 1)
    watch = CoreWatch(loadavg=str(path))
    assert watch.free()
    _loadavg(path, watch.cores)  # this process among them: it fits
    assert watch.free()
    _loadavg(path, watch.cores + 1)  # read again at each look (the same descriptor)
    assert not watch.free()
    path.write_text("garbage")  # unreadable: as if free (as before the watch)
    assert watch.free()
    watch.close()
    assert CoreWatch(loadavg=str(tmp_path / "none")).free()  # no /proc/loadavg: always free
    real = CoreWatch()
    assert isinstance(real.free(), bool) and real.cores >= 1
    real.close()


def test_polling_stops_at_the_second_look_that_finds_every_core_wanted(tmp_path: Path) -> None:
    path = tmp_path / "loadavg"
    _loadavg(path, 1)
    watch = CoreWatch(every_s=1.0, loadavg=str(path))
    _loadavg(path, watch.cores + 3)
    assert watch.may_spin(10.0)  # first look: crowded once (a thread woke for a moment?)
    assert watch.may_spin(10.5)  # no look before every_s has gone by
    assert not watch.may_spin(11.0)  # crowded at the second look: stop
    assert watch.may_spin(12.0)  # the count starts over for the next polling
    _loadavg(path, 1)
    assert watch.may_spin(13.0)  # a free look in between resets it
    _loadavg(path, watch.cores + 3)
    assert watch.may_spin(14.0) and not watch.may_spin(15.0)
    watch.close()


def test_a_task_process_stops_polling_for_its_next_batch_when_every_core_is_wanted(tmp_path: Path) -> None:
    path = tmp_path / "loadavg"
    a, b = socket.socketpair()
    reader = MessageReader(b)
    _loadavg(path, 1)  # free: polls until its time is up
    reader.cores = CoreWatch(every_s=0.001, loadavg=str(path))
    t0 = time.monotonic()
    assert reader._poll(t0 + 0.05) is False and time.monotonic() - t0 >= 0.05 and reader.polls > 0
    _loadavg(path, reader.cores.cores + 1)  # crowded: stops within a few looks, not after 60 s
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(reader._poll(time.monotonic() + 60)), daemon=True)
    thread.start()
    thread.join(10)
    assert got == [False]
    a.close()
    b.close()
