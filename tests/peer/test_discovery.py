"""Discovery over real UDP sockets on loopback: announcers and listeners in threads.

Keyed peers here still use interface 127.0.0.1 and TTL 0, so nothing leaves
the machine.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from peer_testing import free_udp_port

from elsewhere.peer.announce import Announcement, PeerState, new_peer_id
from elsewhere.peer.discovery import Announcer, DiscoveryConfig, Listener
from elsewhere.peer.keys import GroupKey, generate_key
from elsewhere.peer.peertable import PeerFilter, PeerInfo
from elsewhere.util.errors import ConfigError, PeerError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


@pytest.fixture
def config() -> DiscoveryConfig:
    """A private multicast group and port, on loopback, for this test alone."""
    group = f"239.255.{random.randrange(1, 255)}.{random.randrange(1, 255)}"
    return DiscoveryConfig(
        port=free_udp_port(), multicast_group=group, interface="127.0.0.1", ttl=0
    )


def _ann(key: GroupKey | None, port: int = 7000, **kw: object) -> Announcement:
    return Announcement(
        new_peer_id(), key.group if key else "", "127.0.0.1", port, "alice", "ws1",
        PeerState.IDLE, 2, 2, 1 << 30, 3600.0, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _ids(peers: list[PeerInfo]) -> set[str]:
    return {p.peer_id for p in peers}


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as s:
        yield s


def _peer(
    stack: ExitStack, key: GroupKey | None, cfg: DiscoveryConfig, port: int = 7000
) -> tuple[Announcement, Listener, Announcer]:
    ann = _ann(key, port)
    listener = stack.enter_context(Listener(key, cfg))
    announcer = stack.enter_context(Announcer(ann, key, cfg))
    return ann, listener, announcer


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "loopback-only"])
def test_two_peers_see_each_other_within_two_seconds(
    keyed: bool, key: GroupKey, config: DiscoveryConfig, stack: ExitStack
) -> None:
    k = key if keyed else None
    a, listen_a, _ = _peer(stack, k, config, 7001)
    b, listen_b, _ = _peer(stack, k, config, 7002)
    both = {a.peer_id, b.peer_id}
    started = time.monotonic()
    assert listen_a.wait_for(lambda peers: _ids(peers) == both, 2.0)
    assert listen_b.wait_for(lambda peers: _ids(peers) == both, 2.0)
    assert time.monotonic() - started < 2.0
    info = {p.peer_id: p for p in listen_a.peers()}[b.peer_id]
    assert info.source[0] == "127.0.0.1"
    assert info.connect_address == ("127.0.0.1", 7002)
    assert info.announcement.state is PeerState.IDLE and info.announcement.slots_free == 2


def test_a_peer_with_another_key_is_never_listed(
    key: GroupKey, other_key: GroupKey, config: DiscoveryConfig, stack: ExitStack
) -> None:
    a, listen_a, _ = _peer(stack, key, config)
    intruder = stack.enter_context(Announcer(_ann(other_key), other_key, config))
    keyless = stack.enter_context(Announcer(_ann(None), None, config))
    seen: set[str] = set()
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        seen |= _ids(listen_a.peers())
        time.sleep(0.05)
    assert seen == {a.peer_id}
    assert intruder.sent >= 2 and keyless.sent >= 2
    assert listen_a.dropped >= 4  # the intruder's and the keyless peer's datagrams
    # where they came from is kept, as not authentic: `peer list` names them apart
    assert {src: authentic for src, (n, _why, authentic) in listen_a.refusals().items() if n >= 2} == {
        "127.0.0.1": False}  # fmt: skip


def test_refused_sources_are_bounded() -> None:
    from elsewhere.peer import discovery
    from elsewhere.util.errors import ProtocolError

    listener = Listener(GroupKey("g", b"k" * 32), DiscoveryConfig(port=17700))  # not started: no socket
    for i in range(3 * discovery._MAX_REFUSED):  # forged sources cannot grow it
        listener._note_refusal(f"127.1.{i // 250}.{i % 250}", ProtocolError("failed authentication"))
    refused = listener.refusals()
    assert len(refused) == discovery._MAX_REFUSED and "127.1.0.191" in refused


def test_one_listener_hears_several_groups_and_no_other(
    key: GroupKey, other_key: GroupKey, stack: ExitStack
) -> None:
    import os

    third = GroupKey("third", os.urandom(32))
    # unicast to one port (no multicast): the case where one socket of a port gets a datagram
    port, their_port = free_udp_port(), free_udp_port()
    cfg = DiscoveryConfig(port=port, multicast_group=None, interface="127.0.0.1",
                          static_peers=(("127.0.0.1", their_port),))  # fmt: skip
    listener = stack.enter_context(Listener(key, cfg, more_keys=[other_key]))
    to_it = DiscoveryConfig(port=their_port, multicast_group=None, interface="127.0.0.1",
                            static_peers=(("127.0.0.1", port),))  # fmt: skip
    a, b, c = _ann(key, 7001), _ann(other_key, 7002), _ann(third, 7003)
    for ann, k in ((a, key), (b, other_key), (c, third)):
        stack.enter_context(Announcer(ann, k, to_it))
    assert listener.wait_for(lambda p: _ids(p) == {a.peer_id, b.peer_id}, 3.0)
    time.sleep(1.2)  # the third group's announcements keep coming: never listed
    assert _ids(listener.peers()) == {a.peer_id, b.peer_id} and listener.dropped >= 2
    with pytest.raises(PeerError, match="keyed listener"):
        Listener(None, cfg, more_keys=[key])


def test_a_stopped_peer_expires_within_four_seconds(
    key: GroupKey, config: DiscoveryConfig, stack: ExitStack
) -> None:
    listener = stack.enter_context(Listener(key, config))
    ann = _ann(key)
    announcer = Announcer(ann, key, config).start()
    assert listener.wait_for(lambda p: ann.peer_id in _ids(p), 2.0)
    announcer.stop(goodbye=False)  # as if it crashed: no LEAVING datagram
    stopped = time.monotonic()
    assert listener.wait_for(lambda p: ann.peer_id not in _ids(p), 5.0)
    waited = time.monotonic() - stopped
    assert 2.0 < waited < 4.3, waited


def test_a_peer_that_says_goodbye_is_dropped_at_once(
    key: GroupKey, config: DiscoveryConfig, stack: ExitStack
) -> None:
    listener = stack.enter_context(Listener(key, config))
    ann = _ann(key)
    announcer = Announcer(ann, key, config).start()
    assert listener.wait_for(lambda p: ann.peer_id in _ids(p), 2.0)
    announcer.stop()
    assert listener.wait_for(lambda p: ann.peer_id not in _ids(p), 0.5)


def test_update_state_is_announced_at_once(key: GroupKey, stack: ExitStack) -> None:
    cfg = DiscoveryConfig(
        port=free_udp_port(), multicast_group="239.255.77.78", interface="127.0.0.1", ttl=0,
        interval_s=5.0, expire_after_s=20.0,
    )  # fmt: skip
    listener = stack.enter_context(Listener(key, cfg))
    ann = _ann(key)
    announcer = stack.enter_context(Announcer(ann, key, cfg))
    assert listener.wait_for(lambda p: ann.peer_id in _ids(p), 2.0)
    time.sleep(0.1)
    started = time.monotonic()
    announcer.update_state(state=PeerState.BUSY, slots_free=0, task="job/3")

    def busy(peers: list[PeerInfo]) -> bool:
        return any(p.announcement.state is PeerState.BUSY for p in peers)

    assert listener.wait_for(busy, 1.0)
    assert time.monotonic() - started < 0.5  # not the 5 s interval
    (info,) = listener.peers()
    assert info.announcement.task == "job/3" and info.announcement.slots_free == 0
    with pytest.raises(ValueError, match="no field"):
        announcer.update_state(colour="red")
    with pytest.raises(ConfigError, match="cannot change"):
        announcer.update_state(peer_id=new_peer_id())


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "loopback-only"])
def test_static_unicast_peers_without_multicast(
    keyed: bool, key: GroupKey, stack: ExitStack
) -> None:
    k = key if keyed else None
    port_a, port_b = free_udp_port(), free_udp_port()
    static = (("127.0.0.1", port_a), ("localhost", port_b))
    cfg_a = DiscoveryConfig(port=port_a, multicast_group=None, static_peers=static,
                            interface="127.0.0.1")  # fmt: skip
    cfg_b = DiscoveryConfig(port=port_b, multicast_group=None, static_peers=static,
                            interface="127.0.0.1")  # fmt: skip
    a, listen_a, _ = _peer(stack, k, cfg_a)
    b, listen_b, _ = _peer(stack, k, cfg_b)
    both = {a.peer_id, b.peer_id}
    assert listen_a.wait_for(lambda p: _ids(p) == both, 2.0)
    assert listen_b.wait_for(lambda p: _ids(p) == both, 2.0)


def test_filter_by_source_address(key: GroupKey, config: DiscoveryConfig, stack: ExitStack) -> None:
    refusing = stack.enter_context(
        Listener(key, config, peer_filter=PeerFilter(refuse_addresses=("127.0.0.0/8",)))
    )
    accepting = stack.enter_context(Listener(key, config))
    ann = _ann(key)
    stack.enter_context(Announcer(ann, key, config))
    assert accepting.wait_for(lambda p: ann.peer_id in _ids(p), 2.0)
    time.sleep(1.2)
    assert refusing.peers() == [] and refusing.received >= 1


def test_loopback_only_listener_drops_datagrams_from_other_sources(key: GroupKey) -> None:
    listener = Listener(None, DiscoveryConfig(port=free_udp_port(), multicast_group=None,
                                              static_peers=(("127.0.0.1", 9),)))  # fmt: skip
    listener._handle(b"anything", ("192.0.2.7", 5000))
    assert listener.dropped == 1 and listener.received == 0


def test_everything_closes(key: GroupKey, config: DiscoveryConfig) -> None:
    before = {t.ident for t in threading.enumerate()}
    listener = Listener(key, config).start()
    announcer = Announcer(_ann(key), key, config).start()
    socks = [*listener._socks, announcer._sock]
    started = time.monotonic()
    announcer.stop()
    listener.stop()
    assert time.monotonic() - started < 1.0  # the listener is woken, not polled
    assert all(s is not None and s.fileno() == -1 for s in socks)
    time.sleep(0.05)
    assert {t.ident for t in threading.enumerate()} == before


def test_stopping_the_listener_wakes_its_waiters(key: GroupKey, config: DiscoveryConfig) -> None:
    # Before: a waiter (a controller's watch of its workers) slept on until its timeout, for
    # nothing came to wake it; the controller's stop joined that watch, and every ew.map on
    # peers ended a second after its last result (ew.map of one task: 1.0 s, now 0.04-0.16 s).
    listener = Listener(key, config).start()
    stopped = threading.Event()
    woken: list[bool] = []

    def watch() -> None:
        woken.append(listener.wait_for(lambda peers: stopped.is_set(), timeout=60.0))

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    time.sleep(0.2)  # (the waiter is waiting)
    stopped.set()
    listener.stop()
    t.join(timeout=30.0)
    assert not t.is_alive(), "the waiter was not woken by stop()"
    assert woken == [True]


def test_a_listener_started_after_one_stopped_lists_what_that_one_heard(
    key: GroupKey, config: DiscoveryConfig
) -> None:
    # Before: each ew.map on peers started a listener that knew no one, and waited for the
    # workers' answer to its first announcement: 60-120 ms before its first connection, every call.
    first = Listener(key, config, carry_over=True).start()
    ann = _ann(key)
    announcer = Announcer(ann, key, config).start()
    try:
        assert first.wait_for(lambda p: ann.peer_id in _ids(p), 5.0)
    finally:
        announcer.stop(goodbye=False)  # silent from now on: only the first listener heard it
        first.stop()
    second = Listener(key, config, carry_over=True).start()
    try:
        assert ann.peer_id in _ids(second.peers())
    finally:
        second.stop()
    other = Listener(GroupKey("test", generate_key()), config, carry_over=True).start()  # another key: nothing of it
    try:
        assert other.peers() == []
    finally:
        other.stop()
    plain = Listener(key, config).start()  # (peer list: only what it hears itself)
    try:
        assert plain.peers() == []
    finally:
        plain.stop()
    # one heard longer ago than it may stay listed is not listed again (the listener that heard
    # it stopped just now: its own age is the reason)
    later = Listener(key, config, carry_over=True)
    listed = later._table.expire_after_s
    import elsewhere.peer.recentpeers as recentpeers

    _, heard = recentpeers._heard[later._recent_key()]
    assert [a.peer_id for a, _, _ in heard] == [ann.peer_id]
    recentpeers._heard[later._recent_key()] = (time.monotonic(), [(a, s, w - listed - 1) for a, s, w in heard])
    later.start()
    try:
        assert later.peers() == []
    finally:
        later.stop()


def test_loopback_only_mode_refuses_other_addresses() -> None:
    with pytest.raises(ConfigError, match=r"127\.0\.0\.1 only"):
        DiscoveryConfig(interface="10.0.0.1").for_key(None)
    with pytest.raises(ConfigError, match="loopback"):
        DiscoveryConfig(static_peers=(("10.0.0.2", 17700),)).for_key(None)
    cfg = DiscoveryConfig(ttl=5, static_peers=(("localhost", 1),)).for_key(None)
    assert cfg.interface == "127.0.0.1" and cfg.ttl == 0
    assert cfg.static_peers == (("127.0.0.1", 1),)


def test_loopback_only_sockets_are_bound_to_loopback() -> None:
    cfg = DiscoveryConfig(port=free_udp_port(), multicast_group="239.255.77.79",
                          static_peers=(("127.0.0.1", 9),))  # fmt: skip
    listener = Listener(None, cfg).start()
    announcer = Announcer(_ann(None), None, cfg).start()
    try:
        bound = {s.getsockname()[0] for s in listener._socks}
        assert bound == {"239.255.77.79", "127.0.0.1"}
        assert announcer._sock is not None
        assert announcer._sock.getsockname()[0] == "127.0.0.1"
        ttl = announcer._sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL)
        iface = announcer._sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, 4)
        assert ttl == 0 and socket.inet_ntoa(iface) == "127.0.0.1"
    finally:
        announcer.stop()
        listener.stop()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"port": 0}, "port"),
        ({"multicast_group": "10.1.1.1"}, "not a multicast"),
        ({"multicast_group": "nonsense"}, "IPv4"),
        ({"interface": "eth0"}, "IPv4"),
        ({"multicast_group": None}, "static peers"),
        ({"ttl": 300}, "ttl"),
        ({"expire_after_s": 1.0}, "expire_after_s"),
        ({"static_peers": (("h", 0),)}, "port"),
    ],
)
def test_config_is_validated(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DiscoveryConfig(**kwargs)  # type: ignore[arg-type]


def test_announcement_of_another_group_is_refused(key: GroupKey) -> None:
    with pytest.raises(ConfigError, match="group"):
        Announcer(_ann(None), key)


def test_an_interface_that_is_not_here_is_named_as_the_cause() -> None:
    import errno

    from elsewhere.peer.discoveryconfig import DiscoveryConfig, _not_here

    cfg = DiscoveryConfig(port=17700, interface="192.0.2.7")  # (nothing is bound or sent here)
    for code, text in ((errno.ENODEV, "No such device"), (errno.EADDRNOTAVAIL, "Cannot assign requested address")):
        with pytest.raises(ConfigError, match=r"cannot listen for peers on interface 192\.0\.2\.7 .*an IPv4 "
                                              r"address of this machine"):  # fmt: skip
            _not_here(OSError(code, text), cfg, "listen for peers")
    _not_here(OSError(errno.EACCES, "Permission denied"), cfg, "announce")  # other causes: as they are
    _not_here(OSError(errno.ENODEV, "No such device"), DiscoveryConfig(port=17700), "announce")
