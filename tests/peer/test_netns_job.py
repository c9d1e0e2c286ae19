"""One job across three hosts: workers in network namespaces on a bridge, found by multicast.

The hosts are ``ew-h1..ew-h3`` (10.77.0.1-3) of ``ci/services/netns.sh``. Every
process that talks on 10.77.0.0/24 runs inside a namespace (``ip netns exec``):
the workers, the controller, the listener. Nothing is sent there from the root
namespace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from peer_procs import WorkerProc, env, free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import services
from elsewhere.peer.keys import write_key

INFO = services.netns()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    pytest.mark.skipif(INFO is None or len(INFO.hosts) < 3,
                       reason=services.why_no_netns() or "needs three test hosts"),
]

JOB = textwrap.dedent("""
    import json, socket, sys, time
    import elsewhere as ew
    from elsewhere.backends.peer import peers

    def where(i):
        time.sleep(0.15)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("10.77.0.254", 9))  # no packet: just which address this host has
        return i, s.getsockname()[0]

    key, port, me = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    out = ew.map(where, range(24), on=peers("net", key=key, port=port, interface=me), timeout=40)
    print(json.dumps(out))
""")

WATCH = textwrap.dedent("""
    import sys, time
    from elsewhere.peer.discovery import DiscoveryConfig, Listener
    from elsewhere.peer.keys import load_key

    key, port, me, lost = load_key(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    with Listener(key, DiscoveryConfig(port=port, interface=me)) as listener:
        if not listener.wait_for(lambda ps: len(ps) >= 3, timeout=15):
            sys.exit("not all workers seen")
        print("READY", flush=True)
        sys.stdin.readline()  # the test cuts the network now
        t0 = time.monotonic()
        if not listener.wait_for(lambda ps: all(p.source[0] != lost for p in ps), timeout=20):
            sys.exit("the cut-off worker never expired")
        print(f"EXPIRED {time.monotonic() - t0:.2f}", flush=True)
        time.sleep(0.3)
        print(f"LEFT {len(listener.peers())}", flush=True)
""")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, list[WorkerProc]]]:
    assert INFO is not None
    tmp = tmp_path_factory.mktemp("netns")
    key = write_key("net", tmp / "net.key")
    port = free_port()
    workers = [
        WorkerProc(["--key", str(key), "--port", str(port), "--interface", h.address,
                    "--slots", "1"], tmp / f"{h.name}.json", netns=h.name)
        for h in INFO.hosts[:3]
    ]
    try:
        for w in workers:
            w.wait_started()
        yield key, port, workers
    finally:
        for w in workers:
            w.stop()


def test_one_job_runs_across_three_hosts(hosts: tuple[Path, int, list[WorkerProc]],
                                         tmp_path: Path) -> None:  # fmt: skip
    assert INFO is not None
    key, port, _ = hosts
    h1 = INFO.hosts[0]
    script = tmp_path / "job.py"
    script.write_text(JOB)
    done = subprocess.run(
        h1.command(sys.executable, str(script), str(key), str(port), h1.address),
        capture_output=True, text=True, timeout=50, env=env({"ELSEWHERE_HOME": str(tmp_path / "home")}),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert [i for i, _ in out] == list(range(24))
    used = {address for _, address in out}
    assert used == {h.address for h in INFO.hosts[:3]}, used


def test_a_host_cut_off_the_network_expires_within_seconds(
    hosts: tuple[Path, int, list[WorkerProc]], tmp_path: Path
) -> None:
    assert INFO is not None
    key, port, _ = hosts
    h1, h3 = INFO.hosts[0], INFO.hosts[2]
    script = tmp_path / "watch.py"
    script.write_text(WATCH)
    watch = subprocess.Popen(h1.command(sys.executable, str(script), str(key), str(port), h1.address,
                                        h3.address),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env())  # fmt: skip
    cut = False
    try:
        assert watch.stdout is not None and watch.stdin is not None
        assert watch.stdout.readline().strip() == "READY", watch.stderr.read() if watch.stderr else ""
        subprocess.run(h3.command("ip", "link", "set", "eth0", "down"), check=True, timeout=10)
        cut = True
        watch.stdin.write("cut\n")
        watch.stdin.flush()
        out, err = watch.communicate(timeout=30)
        assert watch.returncode == 0, err
        lines = dict(line.split() for line in out.split("\n") if line.strip())
        assert float(lines["EXPIRED"]) < 6.0  # silent for about three announcements
        assert lines["LEFT"] == "2"  # the other two are still there
    finally:
        if cut:
            subprocess.run(h3.command("ip", "link", "set", "eth0", "up"), timeout=10)
            subprocess.run(h3.command("ip", "route", "replace", "224.0.0.0/4", "dev", "eth0"),
                           timeout=10, capture_output=True)  # fmt: skip
        if watch.poll() is None:
            watch.kill()
            watch.wait(5)
        time.sleep(0.1)
