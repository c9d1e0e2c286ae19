"""Discovery between hosts: peers in network namespaces on a private bridge.

Three namespaces ``ewpt-<pid>-h1..h3`` on a bridge that lives in its own
namespace; subnet 10.77.0.0/24 exists only inside them (nothing is sent from
the root namespace). Needs root and ``ip``; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import elsewhere.peer
from elsewhere.peer.keys import GroupKey, generate_key

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PEER_SCRIPT = r"""
import json, os, sys, time
from elsewhere.peer import Announcement, Announcer, DiscoveryConfig, Listener, PeerState, new_peer_id
from elsewhere.peer.keys import GroupKey

specs = json.loads(sys.argv[1])
running, ids = [], []
for spec in specs:
    key = GroupKey("net", bytes.fromhex(spec["key"])) if spec["key"] else None
    cfg = DiscoveryConfig(interface=spec["interface"], port=17700)
    ann = Announcement(new_peer_id(), key.group if key else "", spec["interface"] or "127.0.0.1",
                       7000, "u", spec["name"], PeerState.IDLE, 1, 1, 1 << 30, 60.0)
    running.append((Listener(key, cfg).start(), Announcer(ann, key, cfg).start()))
    ids.append(ann.peer_id)
time.sleep(float(sys.argv[2]))
seen = [[(p.peer_id, p.source[0], list(p.connect_address)) for p in l.peers()] for l, _ in running]
for listener, announcer in running:
    announcer.stop(goodbye=False)  # a goodbye could reach a peer still taking its snapshot
    listener.stop()
print(json.dumps({"ids": ids, "seen": seen}))
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[str]]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    prefix = f"ewpt-{os.getpid()}"
    bridge = f"{prefix}-br"
    names = [f"{prefix}-h{i}" for i in (1, 2, 3)]
    created: list[str] = []
    try:
        try:
            _ip("netns", "add", bridge)
        except (subprocess.CalledProcessError, OSError) as exc:
            pytest.skip(f"cannot create a network namespace here: {exc}")
        created.append(bridge)
        _ip("-n", bridge, "link", "set", "lo", "up")
        _ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", bridge, "link", "set", "br0", "type", "bridge", "mcast_snooping", "0")
        _ip("-n", bridge, "link", "set", "br0", "up")
        for i, name in enumerate(names, 1):
            _ip("netns", "add", name)
            created.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", bridge, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0",
                "netns", name)  # fmt: skip
            _ip("-n", bridge, "link", "set", f"v{i}", "master", "br0", "up")
            _ip("-n", name, "addr", "add", f"10.77.0.{i}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "route", "add", "224.0.0.0/4", "dev", "eth0")
        yield names
    finally:
        for name in reversed(created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


def _run_in(host: str, specs: list[dict[str, object]], seconds: float) -> subprocess.Popen[str]:
    src = Path(elsewhere.peer.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.Popen(
        ["ip", "netns", "exec", host, sys.executable, "-c", PEER_SCRIPT, json.dumps(specs),
         str(seconds)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def test_peers_on_three_hosts(hosts: list[str]) -> None:
    key = GroupKey("net", generate_key())
    other = GroupKey("net", generate_key())
    h1, h2, h3 = hosts
    procs = [
        _run_in(h1, [{"name": "h1", "key": key.secret.hex(), "interface": "10.77.0.1"},
                     {"name": "h1-local", "key": None, "interface": None}], 3.0),
        _run_in(h2, [{"name": "h2", "key": key.secret.hex(), "interface": "10.77.0.2"}], 3.0),
        _run_in(h3, [{"name": "h3", "key": other.secret.hex(), "interface": "10.77.0.3"},
                     {"name": "h3-local", "key": None, "interface": None}], 3.0),
    ]  # fmt: skip
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    (h1_keyed, h1_local), (h2_keyed,), (h3_other, h3_local) = (r["ids"] for r in results)
    seen = [r["seen"] for r in results]

    def ids(listing: list[list[object]]) -> set[object]:
        return {entry[0] for entry in listing}

    # keyed peers of one group find each other across hosts, by their real source address
    assert ids(seen[0][0]) == {h1_keyed, h2_keyed}
    assert ids(seen[1][0]) == {h1_keyed, h2_keyed}
    from_h2 = next(e for e in seen[0][0] if e[0] == h2_keyed)
    assert from_h2[1] == "10.77.0.2" and from_h2[2] == ["10.77.0.2", 7000]
    # another key: sees only itself, and is seen by no one
    assert ids(seen[2][0]) == {h3_other}
    # loopback-only peers never leave their host
    assert ids(seen[0][1]) == {h1_local}
    assert ids(seen[2][1]) == {h3_local}
