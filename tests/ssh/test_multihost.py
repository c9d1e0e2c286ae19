"""ssh nodes on several real hosts: the sshds of the network-namespace hosts ew-h1..ew-h3
(ci/services/netns.sh + ci/services/netns-sshd.sh).

The client runs INSIDE ew-h1 (``ip netns exec ew-h1 python client.py``: 10.77.0.0/24 is
reachable only there) and prints JSON lines that these tests parse; the hosts are reached by
their ssh aliases h1..h3. Every namespace host shares this machine's file system, so each
host gets its own job-copy folder: its ``python=`` is a small wrapper that enters
``<base>/<alias>`` before starting the venv's interpreter, and the relative
``remote_storage="store"`` then resolves to ``<base>/<alias>/store`` there (SSHCluster puts
every node's copy at ``<remote_storage>/<job id>``: with one shared folder, two nodes would
overwrite each other's queue; see the report on a per-host remote_storage).

What is proved: (a) a job spread over three hosts comes back whole, each task ran inside the
network namespace of the host whose copy it ran in, by a worker of that copy, over one ssh
login per host; (b) SIGKILL of one host's workers mid-job makes its running tasks "lost"
(retries=0) or retried there (retries=1) and keeps every other result; (c) a host whose
network is cut mid-job is given up after host_timeout_s and its unfinished tasks finish on
another host.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import netns_ssh

pytestmark = [pytest.mark.timeout(300), pytest.mark.integration]

PY = sys.executable  # the venv's interpreter: every host sees the same file system

# The client, run inside ew-h1. argv[1]: JSON parameters. Prints "SUBMITTED {...}" once the
# job is placed, then "RESULT {...}" when it is done (or "FAILED ..." on an exception).
CLIENT = r'''
import json, os, sys, time, traceback
import elsewhere as ew

def work(x, hold):
    # "started-<x>" gets one byte per attempt, in the job copy this task runs in
    with open(f"started-{x}", "a") as f:
        f.write(".")
    time.sleep(hold)
    return [x * x, os.getcwd(), os.stat("/proc/self/ns/net").st_ino, ew.task().attempt]

def main():
    p = json.loads(sys.argv[1])
    cl = ew.ssh({h: 2 for h in p["hosts"]}, ssh_config=p["ssh_config"], python=p["python"],
                remote_storage="store", host_timeout_s=p.get("host_timeout_s", 60.0),
                ssh_options=p.get("ssh_options", []))
    t0 = time.monotonic()
    job = ew.submit(work, range(p["n"]), [p["hold"]] * p["n"], on=cl, name=p["name"],
                    retries=p.get("retries", 0))
    t_submit = time.monotonic() - t0
    plan = cl.get_job_cluster_data(job).get("hosts", {})
    print("SUBMITTED " + json.dumps({"id": job.id, "path": str(job.path), "submit_s": t_submit,
                                     "plan": plan}), flush=True)
    job.wait(timeout=p["wait_s"], progress=False)
    out = []
    for i, v in enumerate(job.results()):
        t = job.tasks[i]
        if isinstance(v, ew.TaskError):
            out.append({"error": {"type": v.type_name, "reason": v.reason, "message": v.message}})
        else:
            out.append({"value": v, "wid": t.worker, "host": t.host})
    print("RESULT " + json.dumps({
        "results": out, "submit_s": t_submit, "total_s": time.monotonic() - t0,
        "state": job.state.value,
        "connections": {h: cl.transport(h).connections_opened for h in cl.nodes},
        "plan": cl.get_job_cluster_data(job).get("hosts", {}),
    }), flush=True)
    cl.close()

try:
    main()
except BaseException:
    print("FAILED " + json.dumps(traceback.format_exc()), flush=True)
    sys.exit(1)
'''


def _pids_naming(needle: str, *, what: bytes = b"") -> list[int]:
    """Pids whose command line contains ``needle`` (and ``what``); only ours carry our folder."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
        except OSError:
            continue
        if needle.encode() in cmd and what in cmd:
            out.append(int(d))
    return out


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_for(cond, timeout_s: float, what: str, step_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(step_s)


class Client:
    """The client process in ew-h1, its JSON lines read by a thread (so waits can time out)."""

    def __init__(self, lab: Lab, params: dict[str, Any]) -> None:
        env = {**os.environ, "ELSEWHERE_HOME": str(lab.base / "home"),
               # a private folder for the ssh master sockets, so teardown finds exactly ours
               "XDG_RUNTIME_DIR": str(lab.base / "run"), "PYTHONUNBUFFERED": "1"}
        (lab.base / "run").mkdir(mode=0o700, exist_ok=True)
        self.proc = subprocess.Popen(
            lab.client_host.command(PY, str(lab.base / "client.py"), json.dumps(params)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(lab.base),
            start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.append(self.proc.stderr.read()),  # type: ignore[union-attr]
                         daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.decode(errors="replace").rstrip("\n"))
        self.lines.put("")  # end of output

    def expect(self, tag: str, timeout_s: float) -> dict[str, Any]:
        """The JSON of the next line starting with ``tag``; fails on FAILED, exit or time-out."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the client printed no {tag} within {timeout_s} s") from None
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1:])
            if line.startswith("FAILED ") or line == "":
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                err = b"".join(self.stderr).decode(errors="replace")[-3000:]
                detail = json.loads(line[7:]) if line.startswith("FAILED ") else "(exited)"
                raise AssertionError(f"the client failed before {tag}: {detail}\nstderr: {err}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class Lab:
    """A private folder for one test: per-host interpreter wrappers and job copies."""

    def __init__(self, info: netns_ssh.NetnsSshInfo) -> None:
        self.info = info
        self.client_host = info.hosts[0]
        # short: the ssh master sockets live under it (a unix socket path has ~100 bytes)
        self.base = Path(tempfile.mkdtemp(prefix="ewmh-", dir="/tmp"))
        (self.base / "client.py").write_text(CLIENT)
        self.python: dict[str, str] = {}
        for h in info.hosts:
            d = self.base / h.alias
            d.mkdir()
            wrapper = d / "python"
            wrapper.write_text(f"#!/bin/sh\ncd '{d}' || exit 1\nexec '{PY}' \"$@\"\n")
            wrapper.chmod(0o755)
            self.python[h.alias] = str(wrapper)
        self.clients: list[Client] = []
        self.copies: dict[str, Path] = {}

    def netns_inode(self, alias: str) -> int:
        return os.stat(f"/run/netns/{self.info.host(alias).namespace}").st_ino

    def placed(self, sub: dict[str, Any]) -> dict[str, Any]:
        """Note where the job of ``sub`` (the SUBMITTED line) put its copies; return ``sub``."""
        self.copies = {h: Path(p["dir"]) for h, p in sub["plan"].items() if p.get("workers")}
        for h, d in self.copies.items():  # each host's copy is in its own folder
            assert d.is_relative_to(self.base / h), (h, d)
        return sub

    def copy(self, alias: str) -> Path:
        """The job copy on host ``alias``."""
        return self.copies[alias]

    def host_of_cwd(self, cwd: str) -> str:
        """The host whose job copy holds ``cwd``."""
        hosts = [h for h, d in self.copies.items() if Path(cwd).is_relative_to(d)]
        assert len(hosts) == 1, (cwd, self.copies)
        return hosts[0]

    def started(self, alias: str) -> dict[int, int]:
        """task -> attempts begun, from the markers in host ``alias``'s copy."""
        out = {}
        for p in (self.copy(alias) / "files").glob("started-*"):
            try:
                out[int(p.name.split("-")[1])] = len(p.read_bytes())
            except (OSError, ValueError):
                pass
        return out

    def client(self, hosts: list[str], **params: Any) -> Client:
        p = {"hosts": hosts, "ssh_config": str(self.info.config),
             "python": {h: self.python[h] for h in hosts}, "name": "multi",
             "n": 6, "hold": 0.0, "wait_s": 150, **params}
        c = Client(self, p)
        self.clients.append(c)
        return c

    def log_sizes(self) -> dict[str, int]:
        """Bytes in each host's sshd log now (to read only what a test adds)."""
        return {h.alias: h.log.stat().st_size if h.log.exists() else 0 for h in self.info.hosts}

    def logins_since(self, sizes: dict[str, int]) -> dict[str, list[tuple[str, int]]]:
        """(client address, client port) of every login each sshd logged since ``sizes``."""
        out: dict[str, list[tuple[str, int]]] = {}
        for h in self.info.hosts:
            with open(h.log, "rb") as f:
                f.seek(sizes.get(h.alias, 0))
                text = f.read().decode(errors="replace")
            out[h.alias] = [(m.group(1), int(m.group(2)))
                            for m in re.finditer(r"Connection from (\S+) port (\d+) on ", text)]
        return out

    def master_ports(self) -> dict[str, int]:
        """host alias -> the client port of our ssh master to it (they persist until close())."""
        out = {}
        for sock in (self.base / "run" / "elsewhere-ssh").glob("cm-*"):
            r = subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "check", "x"],
                               capture_output=True, text=True, timeout=10, check=False)
            m = re.search(r"pid=(\d+)", r.stderr)
            if not m:
                continue
            pid = int(m.group(1))
            inodes = set()
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
            # the master lives in the client's namespace: its own TCP table names the peer
            for row in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
                f = row.split()
                if f[9] in inodes:
                    peer = ".".join(str(b) for b in reversed(bytes.fromhex(f[2].split(":")[0])))
                    for h in self.info.hosts:
                        if h.address == peer:
                            out[h.alias] = int(f[1].split(":")[1], 16)
        return out

    def others_running(self) -> bool:
        """Another run of these tests uses the same sshds now (its logins mix with ours)."""
        return any(p != self.base for p in Path("/tmp").glob("ewmh-*"))

    def close(self) -> None:
        for c in self.clients:
            c.stop()
        # workers and agents still running in our job copies (only ours name this folder)
        _kill(_pids_naming(str(self.base)))
        # the ssh masters our clients left (ControlPersist), by their private sockets
        for sock in (self.base / "run" / "elsewhere-ssh").glob("cm-*"):
            if sock.is_socket():
                subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                               capture_output=True, timeout=10, check=False)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def lab():
    if os.geteuid() != 0:
        pytest.skip("needs root: the hosts are network namespaces (ip netns exec)")
    if shutil.which("ip") is None or shutil.which("ssh") is None:
        pytest.skip("needs ip (iproute2) and the ssh client")
    info = netns_ssh.netns_ssh()
    if info is None:
        pytest.skip(netns_ssh.why_no_netns_ssh())
    if len(info.hosts) < 3:
        pytest.skip(f"needs 3 namespace hosts (a client and two nodes), found {len(info.hosts)}: "
                    "run ci/services/netns.sh 3 && ci/services/netns-sshd.sh")
    lab = Lab(info)
    try:
        yield lab
    finally:
        lab.close()


def _values(res: dict[str, Any]) -> list[Any]:
    return [r.get("value") for r in res["results"]]


# --------------------------------------------------------------------------- (a)


def test_job_spread_over_three_hosts_each_task_on_its_host(lab):
    hosts = ["h1", "h2", "h3"]  # the client's own host too, reached over ssh like the others
    sizes = lab.log_sizes()
    alone = not lab.others_running()
    c = lab.client(hosts, n=30, hold=0.05, name="spread")
    lab.placed(c.expect("SUBMITTED", 120))
    res = c.expect("RESULT", 150)
    masters = lab.master_ports()
    logins = lab.logins_since(sizes)
    alone = alone and not lab.others_running()

    assert res["state"] == "finished"
    values = _values(res)
    assert [v[0] for v in values] == [x * x for x in range(30)]
    used = set()
    for i, (r, v) in enumerate(zip(res["results"], values)):
        host = lab.host_of_cwd(v[1])
        used.add(host)
        # it ran in that host's own copy, inside that host's network namespace ...
        assert v[1] == str(lab.copy(host) / "files"), (i, v[1])
        assert v[2] == lab.netns_inode(host), (i, host)
        # ... by a worker of that copy (its journal is there, and nowhere else)
        assert (lab.copy(host) / "journal" / f"{r['wid']}.rec").is_file(), (i, r)
        assert [h for h in hosts if (lab.copy(h) / "journal" / f"{r['wid']}.rec").exists()] == [host]
        assert r["host"]  # the worker's host name (the same for all: namespaces share it)
        assert v[3] == 0
    assert used == set(hosts), f"tasks ran only on {sorted(used)}"
    # each host got the contiguous range the plan gave it
    for h in hosts:
        a, b = res["plan"][h]["tasks"]
        assert {lab.host_of_cwd(values[t][1]) for t in range(a, b)} == {h}
    # one ssh login per host for the whole session (probe, copy, start, every poll): the
    # transport says so, and each sshd logged exactly one login from our master's port
    assert res["connections"] == {h: 1 for h in hosts}
    client = lab.client_host.address
    assert sorted(masters) == hosts
    for h in hosts:
        assert logins[h].count((client, masters[h])) == 1, (h, logins[h], masters)
        if alone:  # no other run of these tests logged in meanwhile: nothing else came in
            assert logins[h] == [(client, masters[h])], (h, logins[h])


# --------------------------------------------------------------------------- (b)


@pytest.mark.parametrize("retries", [0, 1])
def test_killed_host_workers_lose_or_retry_only_their_running_tasks(lab, retries):
    victim = "h3"
    c = lab.client(["h2", victim], n=8, hold=2.0, retries=retries, name=f"kill-{retries}")
    lab.placed(c.expect("SUBMITTED", 120))
    copy = lab.copy(victim)
    _wait_for(lambda: lab.started(victim), 60, f"a task to start on {victim}")
    workers = _pids_naming(str(copy), what=b"elsewhere.worker")
    # read just before the kill (2 s tasks); a marker still empty is a start caught between
    # the file's creation and its byte: not counted as started
    running = {t for t, n in lab.started(victim).items() if n}
    assert workers, f"no worker process of {copy} found"
    _kill(workers)
    res = c.expect("RESULT", 150)

    assert res["state"] in ("finished", "failed")
    a, b = res["plan"][victim]["tasks"]
    assert running and running <= set(range(a, b))
    results = res["results"]
    lost = {t for t, r in enumerate(results) if "error" in r}
    again = {t for t, r in enumerate(results) if "value" in r and r["value"][3] == 1}
    # What had started before the kill was hit (lost, or run again); so may be a task a
    # killed worker had just begun (its .cur names it before the task writes that it started):
    # at most one per killed worker, and only on the victim.
    hit = lost | again
    assert running <= hit <= set(range(a, b)) and len(hit) <= len(workers), (running, lost, again)
    assert not (again if retries == 0 else lost), (lost, again)
    for t, r in enumerate(results):
        if t in lost:
            assert r["error"]["reason"] == "lost" and r["error"]["type"] == "WorkerLost", (t, r)
            continue
        value, cwd, _, attempt = r["value"]
        assert value == t * t
        if t in again:  # retried, on the same host, by a replacement worker
            assert lab.host_of_cwd(cwd) == victim
            if t in running:
                assert lab.started(victim)[t] == 2  # it had started once before the kill
            assert int(r["wid"].rsplit("-", 2)[1]) not in workers  # not a killed worker
        else:
            assert attempt == 0, (t, r)
    # the host went on with replacement workers: its other tasks ran there, not elsewhere
    assert all(lab.host_of_cwd(r["value"][1]) == victim
               for t, r in enumerate(res["results"]) if a <= t < b and "value" in r)


def test_workers_killed_on_two_hosts_each_lose_only_their_running_tasks(lab):
    # each host writes its own reapers' records; both must reach the client's job folder
    victims = ["h2", "h3"]
    c = lab.client(victims, n=8, hold=2.0, retries=0, name="kill-both")
    lab.placed(c.expect("SUBMITTED", 120))
    running: dict[str, set[int]] = {}
    for victim in victims:
        _wait_for(lambda victim=victim: lab.started(victim), 60, f"a task to start on {victim}")
    for victim in victims:
        copy = lab.copy(victim)
        workers = _pids_naming(str(copy), what=b"elsewhere.worker")
        running[victim] = {t for t, n in lab.started(victim).items() if n}
        assert workers, f"no worker process of {copy} found"
        _kill(workers)
    res = c.expect("RESULT", 150)
    lost = {t for t, r in enumerate(res["results"]) if "error" in r}
    for victim in victims:
        a, b = res["plan"][victim]["tasks"]
        assert running[victim] <= lost, (victim, running, lost)
        assert lost & set(range(a, b)), (victim, lost)


# --------------------------------------------------------------------------- (c)


def _routes(ns: str) -> list[str]:
    out = subprocess.run(["ip", "-n", ns, "-4", "route", "show"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def test_host_cut_off_mid_job_its_tasks_move_and_the_job_completes(lab):
    victim = lab.info.host("h3")
    c = lab.client(
        ["h2", "h3"], n=10, hold=1.0, name="cut", host_timeout_s=3.0,
        # notice a dead link in ~3 s (the defaults, 15 s x 4, would take a minute)
        ssh_options=["ServerAliveInterval=1", "ServerAliveCountMax=2", "ConnectTimeout=3"])
    lab.placed(c.expect("SUBMITTED", 120))
    _wait_for(lambda: lab.started("h3"), 60, "a task to start on h3")
    routes = _routes(victim.namespace)
    cut_at = time.monotonic()
    subprocess.run(victim.command("ip", "link", "set", "eth0", "down"), check=True, timeout=10)
    try:
        res = c.expect("RESULT", 150)
        took = time.monotonic() - cut_at
    finally:
        subprocess.run(victim.command("ip", "link", "set", "eth0", "up"), check=True, timeout=10)
        # a link going down drops the routes through it: put back those the kernel does not
        for route in routes:
            if route not in _routes(victim.namespace):
                subprocess.run(["ip", "-n", victim.namespace, "route", "replace", *route.split()],
                               check=False, timeout=10)
    assert _routes(victim.namespace) == routes

    assert res["state"] == "finished", res
    values = _values(res)
    assert [v[0] for v in values] == [x * x for x in range(10)]
    plan = res["plan"]
    assert plan["h3"].get("abandoned"), plan["h3"]
    moved = plan["h2"].get("moved_in", [])
    a, b = plan["h3"]["tasks"]
    assert moved and set(moved) <= set(range(a, b))
    for t in moved:  # what h3 had not finished was run on h2, in h2's namespace
        assert lab.host_of_cwd(values[t][1]) == "h2"
        assert values[t][2] == lab.netns_inode("h2")
    # given up after host_timeout_s, not after ssh's minute-long defaults
    assert took < 60, f"the job took {took:.0f} s after the cut"
