"""Announcements in a large group, on a simulated clock: the pace that grows with the group,
expiry that follows it, and small groups as they were. No sockets: the announcers and the
listener are never started; their sans-IO halves are driven here."""

from __future__ import annotations

import functools
import hashlib
import heapq
import hmac
import math
import random
import struct
import threading
from dataclasses import replace

import msgpack
import pytest

from elsewhere.peer.announce import (
    Announcement,
    AnnouncementDecoder,
    AnnounceTimer,
    ClockSkew,
    PeerState,
    announce_key,
    encode_announcement,
)
from elsewhere.peer.discovery import Announcer, DiscoveryConfig, Listener
from elsewhere.peer.keys import GroupKey
from elsewhere.peer.peertable import PeerTable
from elsewhere.util.errors import ProtocolError

pytestmark = pytest.mark.timeout(60)

EPOCH = 1_800_000_000.0  # the wall clock at simulated time 0


def _ann(key: GroupKey, i: int, state: PeerState = PeerState.IDLE) -> Announcement:
    return Announcement(f"{i + 1:032x}", key.group, f"10.0.{i >> 8 & 255}.{i & 255}", 7000, "alice",
                        f"ws{i}", state, 2, 2, 1 << 30, math.inf)  # fmt: skip


def _timer_rate(n: int, seconds: float, change_every_s: float, seed: int = 7) -> float:
    """Datagrams a second that ``n`` AnnounceTimers send in all (the default group_rate, 200),
    each peer changing state about every ``change_every_s``, over the last ``seconds`` of
    twice that. Each timer is looked at as the announcer thread does: when due, at least every
    second, and at once on a change."""
    rng = random.Random(seed)
    timers = [AnnounceTimer(rng=random.Random(rng.random())) for _ in range(n)]
    looks = [rng.uniform(0, 1) for _ in range(n)]
    events = [(t, i, "look") for i, t in enumerate(looks)]
    events += [(rng.expovariate(1 / change_every_s), i, "change") for i in range(n)]
    heapq.heapify(events)
    sent = 0
    while events[0][0] < 2 * seconds:
        t, i, kind = heapq.heappop(events)
        timer = timers[i]
        if kind == "change":
            timer.changed()
            heapq.heappush(events, (t + rng.expovariate(1 / change_every_s), i, "change"))
        elif t != looks[i]:  # superseded by an earlier look
            continue
        elif timer.due(t, n) <= t:
            timer.sent(t, n)
            sent += t >= seconds
        look = max(t, min(timer.due(t, n), t + 1.0))
        if kind == "look" or look < looks[i]:
            looks[i] = look
            heapq.heappush(events, (look, i, "look"))
    return sent / seconds


def test_the_interval_grows_with_the_group_and_the_groups_rate_stays_bounded() -> None:
    timer = AnnounceTimer()  # 1 s, +-20 %, 200 datagrams a second for the group
    assert [timer.interval(n) for n in (1, 2, 200, 1000, 10_000)] == [1.0, 1.0, 1.0, 5.0, 50.0]
    # the whole group's datagrams a second, periodic and prompted by changes together
    # (600 peers: every 3 s; at one a second each they would send 600 a second)
    quiet = _timer_rate(600, 15.0, change_every_s=1e9)
    assert 190 < quiet <= 200 * 1.03, quiet
    busy = _timer_rate(600, 15.0, change_every_s=2.0)  # every peer changes every 2 s
    assert 190 < busy <= 200 * 1.03, busy
    # a group of 100: a datagram a second each, as before, and changes at once out of the rest
    # of its share (at 10 changes a second each, version 1 sent 1 000 a second)
    assert _timer_rate(100, 10.0, change_every_s=1e9) == pytest.approx(100, rel=0.05)
    assert 100 < _timer_rate(100, 10.0, change_every_s=0.1) <= 200 * 1.03


def test_a_datagram_announces_its_interval_and_a_change_waits_for_its_turn(key: GroupKey) -> None:
    size = [10_000]
    announcer = Announcer(_ann(key, 0), key, DiscoveryConfig(), rng=random.Random(1),
                          group_size=lambda: size[0])  # fmt: skip
    decoder = AnnouncementDecoder(key)
    first = decoder.decode(announcer.datagram(0.0, EPOCH, announcer.group_size()), EPOCH)
    assert first.interval_s == 50.0
    assert 40.0 <= announcer.due(0.0, 10_000) <= 60.0  # +-20 %
    announcer.update_state(state=PeerState.BUSY, slots_free=0)  # its one credit: at once
    assert announcer.due(1.0, 10_000) == 1.0
    announcer.datagram(1.0, EPOCH + 1, 10_000)
    announcer.update_state(state=PeerState.IDLE, slots_free=2)  # none left: the periodic one
    assert 40.0 <= announcer.due(2.0, 10_000) <= 61.0


def test_only_news_is_announced_at_once(key: GroupKey) -> None:
    """A change goes out at once only if it tells listeners something the last datagram did
    not: a slot freed and filled again before the datagram went says nothing, nor does free
    memory that moved by an eighth or less (the periodic datagram carries it); a new state,
    a bigger move, or a nudge (a new controller listens) goes at once."""
    announcer = Announcer(_ann(key, 0), key, DiscoveryConfig(), rng=random.Random(1),
                          group_size=lambda: 2)  # fmt: skip
    announcer.datagram(0.0, EPOCH, 2)
    periodic = announcer.due(0.5, 2)
    assert 0.8 <= periodic <= 1.2
    announcer.update_state(state=PeerState.BUSY, slots_free=0)
    assert announcer.due(0.5, 2) == 0.5  # news: at once
    announcer.update_state(state=PeerState.IDLE, slots_free=2)  # undone before it went
    assert announcer.due(0.5, 2) == periodic
    announcer.update_state(mem_bytes=(1 << 30) - (1 << 27))  # an eighth less: not news
    assert announcer.due(0.5, 2) == periodic
    announcer.update_state(mem_bytes=1 << 29)  # half: news
    assert announcer.due(0.5, 2) == 0.5
    sent = AnnouncementDecoder(key).decode(announcer.datagram(0.5, EPOCH + 0.5, 2), EPOCH + 0.5)
    assert sent.mem_bytes == 1 << 29
    announcer.update_state()  # a nudge: the same again, at once
    assert announcer.due(0.6, 2) == 0.6
    announcer.datagram(0.6, EPOCH + 0.6, 2)
    announcer.update_state(time_s=3600.0)  # a limit where there was none: news
    assert announcer.due(0.7, 2) == 0.7


def test_a_peer_is_not_expired_early_when_its_interval_grew(key: GroupKey) -> None:
    """The group grows from 2 to 10 000 peers while a receiver watches one of them: the
    peer's datagrams come up to ~60 s apart, and it stays listed throughout, because the
    next datagram always comes within the interval the last one promised."""
    size = [2]
    announcer = Announcer(_ann(key, 0), key, DiscoveryConfig(), rng=random.Random(3),
                          group_size=lambda: size[0])  # fmt: skip
    listener = Listener(key, DiscoveryConfig())
    pid = announcer.announcement.peer_id
    sent: list[tuple[float, float]] = []  # (when, the interval it promised)
    t, next_look = 0.0, 0.0
    while t < 600.0:
        if t >= 20.0:  # a group of 10 000 comes up over 10 s
            size[0] = min(10_000, 2 + int((t - 20.0) * 1000))
        if t >= next_look:
            n = announcer.group_size()
            if announcer.due(t, n) <= t:
                data = announcer.datagram(t, EPOCH + t, n)
                listener.receive(data, ("10.0.0.1", 17700), EPOCH + t, t)
                sent.append((t, listener.peers()[0].announcement.interval_s))
            next_look = t + min(announcer.due(t, n) - t, 1.0)  # the thread's look
        listener.tick(t)
        assert [p.peer_id for p in listener.peers()] == [pid], f"expired at {t:.2f} s"
        t = round(t + 0.05, 2)
    gaps = [(b - a, promised) for (a, promised), (b, _) in zip(sent, sent[1:])]
    assert max(gap for gap, _ in gaps) > 40.0  # long silences: a fixed 3.5 s expiry drops it
    assert all(gap <= promised * 1.2 + 0.05 for gap, promised in gaps)  # every promise kept
    assert sent[0][0] == 0.0 and sent[-1][1] == 50.0
    for s in range(6000, 10_000):  # now silent for good
        listener.tick(s / 10)
    assert listener.peers() == []  # expired after 3.5 of its 50 s intervals
    assert listener.group_size(key.group) == 0


def test_a_small_group_discovers_as_quickly_as_before(key: GroupKey) -> None:
    """At 2 peers: the first datagram at once, then one a second (+-20 %), a change at once,
    and silent peers expire after 3.5 s, as in version 1."""
    timer = AnnounceTimer(rng=random.Random(5))
    assert timer.due(100.0, 2) == -math.inf  # never announced: at once
    assert timer.sent(100.0, 2) == 1.0
    times = [100.0]
    for _ in range(200):
        times.append(timer.due(times[-1], 2))
        timer.sent(times[-1], 2)
    intervals = [b - a for a, b in zip(times, times[1:])]
    assert min(intervals) >= 0.8 and max(intervals) <= 1.2
    assert sum(intervals) / len(intervals) == pytest.approx(1.0, abs=0.03)
    now = times[-1] + 0.01
    timer.changed()
    assert timer.due(now, 2) == now
    timer.sent(now, 2)
    timer.changed()  # and the next one too: a group of 2 has ~99 datagrams a second to spare
    assert timer.due(now + 0.02, 2) <= now + 0.02

    listener = Listener(key, DiscoveryConfig())
    announcer = Announcer(
        _ann(key, 1), key, DiscoveryConfig(), group_size=listener.pace_for(key.group)
    )
    data = announcer.datagram(10.0, EPOCH + 10, announcer.group_size())
    listener.receive(data, ("10.0.0.2", 17700), EPOCH + 10, 10.0)
    assert len(listener.peers()) == 1 and listener.peers()[0].announcement.interval_s == 1.0
    listener.tick(13.4)
    assert len(listener.peers()) == 1
    listener.tick(13.8)
    assert listener.peers() == []


def _version1_datagram(key: GroupKey, ann: Announcement) -> bytes:
    """What a peer of the previous version sends: the body without the interval."""
    a = ann
    body = msgpack.packb([a.group, a.address, a.port, a.user, a.host, int(a.state), a.slots,
                          a.slots_free, a.mem_bytes, a.time_s, a.task, a.encrypt, list(a.ciphers)])  # fmt: skip
    prefix = struct.pack(">4sBBHQQ16s", b"ELSA", 1, 0, len(body), round(a.timestamp * 1000), a.counter,
                         bytes.fromhex(a.peer_id))  # fmt: skip
    return prefix + body + hmac.new(announce_key(key), prefix + body, hashlib.sha256).digest()


def test_a_previous_version_peer_keeps_the_group_at_the_old_pace(key: GroupKey) -> None:
    listener = Listener(key, DiscoveryConfig())
    pace = listener.pace_for(key.group)
    for i in range(1000):
        data = _signed(key, _ann(key, i), timestamp=EPOCH, counter=1, interval_s=5.0)
        listener.receive(data, ("10.0.0.3", 17700), EPOCH, 0.0)
    assert pace() == 1000 and AnnounceTimer().interval(pace()) == 5.0
    old = replace(_ann(key, 5000), timestamp=EPOCH + 1, counter=1)
    listener.receive(_version1_datagram(key, old), ("10.0.0.4", 17700), EPOCH + 1, 1.0)
    assert listener.peers()[-1].announcement.interval_s == 0.0  # (absent: 0)
    assert pace() == 1  # it expires its peers after 3.5 s: nobody slows down
    listener.tick(4.6)  # the old peer silent for 3.6 s: gone; the others have 17.5 s
    assert pace() == 1000 and len(listener.peers()) == 1000
    # and a datagram of this version is one the previous version reads: the same 13 fields
    # first, the interval appended (it reads the first 13 and ignores the rest)
    ours = encode_announcement(replace(old, interval_s=2.5), key)
    body = msgpack.unpackb(ours[40:-32])
    assert body[:13] == msgpack.unpackb(_version1_datagram(key, old)[40:-32]) and body[13] == 2500


@functools.lru_cache(maxsize=4)
def _signing_key(key: GroupKey) -> bytes:
    return announce_key(key)


def _signed(key: GroupKey, ann: Announcement, **changes: object) -> bytes:
    """The datagram of ``ann`` with ``changes`` (the key derived once)."""
    ann = replace(ann, **changes)  # type: ignore[arg-type]
    return encode_announcement(ann, key, signing_key=_signing_key(key))


def test_a_worker_lists_the_controllers_and_counts_the_others(key: GroupKey) -> None:
    table = PeerTable(only_states=(PeerState.CONTROLLER,))
    for i in range(50):
        state = PeerState.CONTROLLER if i < 3 else PeerState.IDLE
        table.update(
            replace(_ann(key, i, state), interval_s=1.0),
            ("10.0.0.5", 1),
            1.0,
        )
    assert len(table) == 3 and table.group_size(key.group) == 50
    assert {p.announcement.state for p in table.peers()} == {PeerState.CONTROLLER}
    assert table.expire(4.4) == [] and table.group_size(key.group) == 50
    gone = table.expire(4.8)  # 3.5 s after the last datagram, within a wheel slot (0.25 s)
    assert len(gone) == 3 and table.group_size(key.group) == 0 and len(table) == 0


def test_repeated_announcements_do_not_wake_waiters_and_wake_ups_are_held(key: GroupKey) -> None:
    listener = Listener(key, DiscoveryConfig())
    wakes = []
    cond = listener._cond

    class Counting(threading.Condition):
        def notify_all(self) -> None:
            wakes.append(1)
            super().notify_all()

    listener._cond = Counting(cond._lock)  # type: ignore[attr-defined]
    announcer = Announcer(_ann(key, 0), key, DiscoveryConfig())
    t = 0.0
    for _ in range(10):  # the same thing, ten times: one wake-up (new peer)
        listener.receive(announcer.datagram(t, EPOCH + t, 1), ("10.0.0.6", 1), EPOCH + t, t)
        t += 1.0
    assert len(wakes) == 1 and listener.changes == 1
    announcer.update_state(state=PeerState.BUSY, slots_free=0)  # something new: a wake-up
    listener.receive(announcer.datagram(t, EPOCH + t, 1), ("10.0.0.6", 1), EPOCH + t, t)
    assert len(wakes) == 2 and listener.changes == 2
    announcer.update_state(state=PeerState.IDLE, slots_free=2)  # 10 ms later: held back
    listener.receive(
        announcer.datagram(t + 0.01, EPOCH + t, 1), ("10.0.0.6", 1), EPOCH + t, t + 0.01
    )
    assert len(wakes) == 2 and listener.changes == 3
    listener.tick(t + 0.03)
    assert len(wakes) == 2
    listener.tick(t + 0.06)  # 50 ms after the last wake-up
    assert len(wakes) == 3


def test_replays_are_refused_in_a_group_larger_than_version_1_remembered(key: GroupKey) -> None:
    """Version 1 remembered the counters of 4096 peers and, past that, pruned the whole memory
    at every datagram: a group of 5000 had replays accepted, at a cost that grew with it."""
    decoder = AnnouncementDecoder(key)
    datagrams = [_signed(key, _ann(key, i), timestamp=EPOCH, counter=1) for i in range(4200)]
    for data in datagrams:
        decoder.decode(data, EPOCH + 1)
    with pytest.raises(ProtocolError, match="replayed"):
        decoder.decode(datagrams[0], EPOCH + 2)
    with pytest.raises(ClockSkew):  # older than the window: refused by its time
        decoder.decode(datagrams[0], EPOCH + 40)
    decoder.decode(_signed(key, _ann(key, 9999), timestamp=EPOCH + 40, counter=1), EPOCH + 40)
    assert len(decoder._last) == 1  # and the others forgotten
