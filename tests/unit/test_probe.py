"""The host probe: cgroup quotas read from files written here, and this machine's real figures."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from elsewhere.hosts.probe import (
    MARKER,
    HostProbe,
    cgroup_cpu_quota,
    cgroup_memory_limit,
    free_cores,
    free_cores_of,
    parse_cfs_quota,
    parse_cpu_max,
    parse_proc_cgroup,
    probe_host,
    usable_cores,
)
from elsewhere.util.version import __version__

pytestmark = pytest.mark.timeout(60)


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


# -- the pure parsers ---------------------------------------------------------------------------


def test_proc_cgroup_maps_each_controller_and_the_unified_line() -> None:
    text = "12:cpu,cpuacct:/docker/abc\n4:memory:/user.slice/u\n0::/system.slice/x.service\nnonsense\n"
    assert parse_proc_cgroup(text) == {
        "cpu": "/docker/abc", "cpuacct": "/docker/abc", "memory": "/user.slice/u",
        "": "/system.slice/x.service",
    }


@pytest.mark.parametrize(("text", "want"), [
    ("max 100000\n", None),
    ("150000 100000\n", (150000, 100000)),
    ("200000\n", (200000, 100000)),  # the period may be left out
    ("", None),
    ("garbage 1", None),
    ("0 100000", None),
])
def test_cpu_max(text: str, want: tuple[int, int] | None) -> None:
    assert parse_cpu_max(text) == want


@pytest.mark.parametrize(("quota", "period", "want"), [
    ("-1\n", "100000\n", None),
    ("250000\n", "100000\n", (250000, 100000)),
    ("x", "100000", None),
    ("50000", "0", None),
])
def test_cfs_quota(quota: str, period: str, want: tuple[int, int] | None) -> None:
    assert parse_cfs_quota(quota, period) == want


def test_free_cores_are_usable_minus_load_from_one_to_usable() -> None:
    assert free_cores_of(8, 0.0) == 8
    assert free_cores_of(8, 2.6) == 5
    assert free_cores_of(8, 30.0) == 1
    assert free_cores_of(4, -1.0) == 4


# -- cgroup folders written here ------------------------------------------------------------------


def test_v2_quota_is_rounded_up_and_cuts_usable_cores(tmp_path: Path) -> None:
    _write(tmp_path, {
        "proc": "0::/user.slice/job\n",
        "fs/cgroup.controllers": "cpu memory\n",
        "fs/user.slice/cpu.max": "max 100000\n",
        "fs/user.slice/job/cpu.max": "150000 100000\n",
    })
    where = {"cgroup_root": str(tmp_path / "fs"), "proc_cgroup": str(tmp_path / "proc")}
    assert cgroup_cpu_quota(**where) == (150000, 100000)
    assert usable_cores(**where) == min(_affinity(), 2)


def test_a_parents_tighter_quota_wins(tmp_path: Path) -> None:
    _write(tmp_path, {
        "proc": "0::/a/b\n",
        "fs/cgroup.controllers": "cpu\n",
        "fs/a/cpu.max": "50000 100000\n",
        "fs/a/b/cpu.max": "400000 100000\n",
    })
    where = {"cgroup_root": str(tmp_path / "fs"), "proc_cgroup": str(tmp_path / "proc")}
    assert cgroup_cpu_quota(**where) == (50000, 100000)
    assert usable_cores(**where) == 1  # half a core is still one core, never none


def test_v1_cfs_quota_in_a_joined_controller_folder(tmp_path: Path) -> None:
    _write(tmp_path, {
        "proc": "3:cpu,cpuacct:/slurm/uid_1/job_7\n2:memory:/slurm/uid_1/job_7\n",
        "fs/cpu,cpuacct/slurm/uid_1/job_7/cpu.cfs_quota_us": "300000\n",
        "fs/cpu,cpuacct/slurm/uid_1/job_7/cpu.cfs_period_us": "100000\n",
        "fs/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "fs/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    where = {"cgroup_root": str(tmp_path / "fs"), "proc_cgroup": str(tmp_path / "proc")}
    assert cgroup_cpu_quota(**where) == (300000, 100000)
    assert usable_cores(**where) == min(_affinity(), 3)


def test_a_container_sees_its_own_cgroup_at_the_root(tmp_path: Path) -> None:
    # /proc/self/cgroup names the host's path; only the mount's root exists in the container
    _write(tmp_path, {
        "proc": "5:cpu:/docker/0123abcd\n",
        "fs/cpu/cpu.cfs_quota_us": "100000\n",
        "fs/cpu/cpu.cfs_period_us": "100000\n",
    })
    where = {"cgroup_root": str(tmp_path / "fs"), "proc_cgroup": str(tmp_path / "proc")}
    assert cgroup_cpu_quota(**where) == (100000, 100000)
    assert usable_cores(**where) == 1


def test_no_cgroup_files_mean_no_quota_and_affinity_alone(tmp_path: Path) -> None:
    where = {"cgroup_root": str(tmp_path / "none"), "proc_cgroup": str(tmp_path / "missing")}
    assert cgroup_cpu_quota(**where) is None
    assert usable_cores(**where) == _affinity()
    assert cgroup_memory_limit(**where) == (None, None)


def test_memory_limit_caps_total_and_available(tmp_path: Path) -> None:
    mib = 1 << 20
    _write(tmp_path, {
        "proc": "0::/box\n",
        "fs/cgroup.controllers": "memory\n",
        "fs/box/memory.max": f"{512 * mib}\n",
        "fs/box/memory.current": f"{300 * mib}\n",
        "fs/box/memory.stat": f"anon 1\ninactive_file {100 * mib}\n",
        "meminfo": "MemTotal:       16384000 kB\nMemFree: 1 kB\nMemAvailable:   8192000 kB\n",
    })
    where = {"cgroup_root": str(tmp_path / "fs"), "proc_cgroup": str(tmp_path / "proc")}
    assert cgroup_memory_limit(**where) == (512 * mib, 200 * mib)
    found = probe_host(**where, meminfo=str(tmp_path / "meminfo"))
    assert found.mem_total_mb == 512
    assert found.mem_available_mb == 312  # the limit less what is used, page cache aside


def test_v1_unlimited_memory_is_no_limit(tmp_path: Path) -> None:
    _write(tmp_path, {
        "proc": "4:memory:/\n",
        "fs/memory/memory.limit_in_bytes": "9223372036854771712\n",
        "fs/memory/memory.usage_in_bytes": "1000\n",
        "meminfo": "MemTotal: 2048 kB\nMemAvailable: 1024 kB\n",
    })
    where = {"cgroup_root": str(tmp_path / "fs"), "proc_cgroup": str(tmp_path / "proc")}
    assert cgroup_memory_limit(**where) == (None, None)
    found = probe_host(**where, meminfo=str(tmp_path / "meminfo"))
    assert (found.mem_total_mb, found.mem_available_mb) == (2, 1)


# -- this machine ---------------------------------------------------------------------------------


def test_this_machine_as_the_system_reports_it() -> None:
    found = probe_host()
    quota = cgroup_cpu_quota()
    want = _affinity() if quota is None else min(_affinity(), -(-quota[0] // quota[1]))
    assert found.usable_cores == want == usable_cores()
    assert 1 <= found.free_cores <= found.usable_cores
    assert 1 <= free_cores() <= found.usable_cores
    assert found.cpu_count == os.cpu_count()
    assert found.load_average is not None and len(found.load_average) == 3
    total = psutil.virtual_memory().total >> 20
    limit = cgroup_memory_limit()[0]
    assert found.mem_total_mb == (total if limit is None else min(total, limit >> 20))
    assert found.mem_available_mb is not None and 0 < found.mem_available_mb <= found.mem_total_mb
    assert found.executable == sys.executable
    assert found.python_version == ".".join(map(str, sys.version_info[:3]))
    assert found.implementation == sys.implementation.name
    assert found.hostname == os.uname().nodename
    assert found.elsewhere_version == __version__


def test_the_dict_round_trips_and_older_answers_still_read() -> None:
    found = probe_host()
    sent = json.loads(json.dumps(found.to_dict()))
    assert sent["cpus_usable"] == found.usable_cores  # the name older clients read
    assert HostProbe.from_dict(sent) == found
    old = {"cpus_usable": 8, "cpu_count": 16, "load_average": [2.6, 1.0, 1.0],
           "elsewhere_version": "0.1.0", "hostname": "h"}
    read = HostProbe.from_dict(old)
    assert (read.usable_cores, read.free_cores, read.mem_total_mb) == (8, 5, None)
    junk = HostProbe.from_dict({"cpus_usable": "many", "load_average": "high", "free_cores": 99})
    assert (junk.usable_cores, junk.free_cores, junk.load_average) == (1, 1, None)


def test_a_probe_with_more_free_than_usable_cores_is_refused() -> None:
    found = HostProbe.from_dict({"cpus_usable": 2})
    with pytest.raises(ValueError, match="free_cores"):
        dataclasses.replace(found, free_cores=3)


def test_the_module_runs_as_a_script_without_elsewhere(tmp_path: Path) -> None:
    # the text alone, as it runs on a host where elsewhere is not installed
    source = Path(sys.modules[HostProbe.__module__].__file__ or "").read_text()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-I", "-c", source], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=30, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith(MARKER))
    info = json.loads(line[len(MARKER):])
    assert info["usable_cores"] == usable_cores()
    assert info["executable"] == sys.executable
