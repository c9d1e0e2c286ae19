"""One look at a host: the cores this process may use, memory, Python and elsewhere.

Usable cores are the CPUs of the process's affinity mask, cut down to the CPU quota of its
cgroup (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, the smallest along
the path from its own cgroup up to the root), a fractional quota rounded up, at least 1: a
container given 2.5 CPUs on a 64-core machine runs 3 tasks at once, not 64. Free cores are the
usable ones minus the 1-minute load average, at least 1. Memory is the machine's, capped by
the cgroup's memory limit where one is set.

Everything that counts cores asks :func:`probe_host` (or :func:`usable_cores` and
:func:`free_cores`, which read less): the local
backend, the ssh agent's ``info`` (``python -m elsewhere.hosts.agent``), ``doctor`` and the
peer worker. The module imports only the standard library and nothing of elsewhere, because
the same text also runs on hosts where elsewhere is not installed:
:func:`elsewhere.hosts.interpreter.remote_python_info` sends it there as ``python -c``, and
``python -m elsewhere.hosts.probe`` prints its answer (one marked JSON line).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import asdict, dataclass

TYPE_CHECKING = False  # typing stays unimported at run time (this module runs on bare hosts)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = [
    "CGROUP_ROOT",
    "MARKER",
    "HostProbe",
    "cgroup_cpu_quota",
    "cgroup_memory_limit",
    "free_cores",
    "free_cores_of",
    "parse_cfs_quota",
    "parse_cpu_max",
    "parse_proc_cgroup",
    "probe_host",
    "usable_cores",
]

#: Where the cgroup file systems are mounted (v2 here, or v1 controllers in folders below it).
CGROUP_ROOT = "/sys/fs/cgroup"
#: The line of ``python -m elsewhere.hosts.probe`` that holds its answer (after any banner).
MARKER = "ELSEWHERE-PYTHON-INFO "
# A cgroup v1 memory limit this high means "no limit" (the kernel writes a page-rounded 2**63).
_NO_LIMIT_BYTES = 1 << 60
_MB = 1 << 20


@dataclass(frozen=True)
class HostProbe:
    """What :func:`probe_host` found on one host.

    Attributes:
        hostname: the host's name (``uname -n``).
        usable_cores: cores this process may run on: affinity, then the cgroup quota
            (rounded up), at least 1.
        free_cores: usable cores minus the 1-minute load average (rounded), at least 1.
        cpu_count: the machine's logical CPUs, whatever this process may use.
        cpu_quota: the cgroup's CPU quota in CPUs (1.5 is 150 ms per 100 ms), or None.
        load_average: the 1, 5 and 15-minute load averages, or None where unknown.
        mem_total_mb: memory in MiB (the machine's, or the cgroup's limit if lower).
        mem_available_mb: memory available to new processes in MiB, or None.
        executable: the Python interpreter that looked (``sys.executable``).
        python_version: its version, ``"3.11.4"``.
        implementation: ``"cpython"``, ``"pypy"``...
        platform: ``sys.platform`` (``"linux"``, ``"darwin"``).
        machine: the hardware (``"x86_64"``, ``"arm64"``).
        elsewhere_version: the elsewhere that interpreter imports, or None.
    """

    hostname: str
    usable_cores: int
    free_cores: int
    cpu_count: int | None
    cpu_quota: float | None
    load_average: tuple[float, float, float] | None
    mem_total_mb: int | None
    mem_available_mb: int | None
    executable: str
    python_version: str
    implementation: str
    platform: str
    machine: str
    elsewhere_version: str | None

    def __post_init__(self) -> None:
        if self.usable_cores < 1 or self.free_cores < 1 or self.free_cores > self.usable_cores:
            raise ValueError(
                f"a host has 1 <= free_cores <= usable_cores, got {self.free_cores} free "
                f"of {self.usable_cores} usable"
            )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form an agent sends (with ``cpus_usable``, the name older clients read)."""
        out = asdict(self)
        out["load_average"] = list(self.load_average) if self.load_average else None
        out["cpus_usable"] = self.usable_cores
        return out

    @classmethod
    def from_dict(cls, info: Mapping[str, Any]) -> HostProbe:
        """Read an answer from another host, of this version or an older one.

        Missing or malformed figures become None (usable cores: 1); free cores are worked
        out from usable cores and load when the answer has none (older agents).
        """
        usable = _int(info.get("usable_cores", info.get("cpus_usable")))
        if usable is None or usable < 1:
            usable = _int(info.get("cpu_count")) or 1
        load = info.get("load_average")
        loads = None
        if isinstance(load, (list, tuple)) and len(load) == 3:
            try:
                loads = (float(load[0]), float(load[1]), float(load[2]))
            except (TypeError, ValueError):
                loads = None
        free = _int(info.get("free_cores"))
        if free is None or not 1 <= free <= usable:
            free = free_cores_of(usable, loads[0] if loads else 0.0)
        quota = info.get("cpu_quota")
        return cls(
            hostname=str(info.get("hostname") or ""),
            usable_cores=usable,
            free_cores=free,
            cpu_count=_int(info.get("cpu_count")),
            cpu_quota=float(quota) if isinstance(quota, (int, float)) else None,
            load_average=loads,
            mem_total_mb=_int(info.get("mem_total_mb")),
            mem_available_mb=_int(info.get("mem_available_mb")),
            executable=str(info.get("executable") or ""),
            python_version=str(info.get("python_version") or ""),
            implementation=str(info.get("implementation") or ""),
            platform=str(info.get("platform") or ""),
            machine=str(info.get("machine") or ""),
            elsewhere_version=_str_or_none(info.get("elsewhere_version")),
        )


def probe_host(
    *,
    cgroup_root: str = CGROUP_ROOT,
    proc_cgroup: str = "/proc/self/cgroup",
    meminfo: str = "/proc/meminfo",
) -> HostProbe:
    """Look at this host from this process: cores, load, memory, Python and elsewhere.

    The paths are parameters so that tests can point them at files of their own.
    Nothing here raises for a missing file or an unusual system: what cannot be
    read is None (usable cores: the CPU count, at least 1).
    """
    usable = usable_cores(cgroup_root=cgroup_root, proc_cgroup=proc_cgroup)
    try:
        loads: tuple[float, float, float] | None = os.getloadavg()
    except (AttributeError, OSError):
        loads = None
    total, available = _memory_mb(meminfo)
    limit, used = cgroup_memory_limit(cgroup_root=cgroup_root, proc_cgroup=proc_cgroup)
    if limit is not None:
        total = min(total, limit // _MB) if total is not None else limit // _MB
        room = max(0, limit - (used or 0)) // _MB
        available = min(available, room) if available is not None else room
    quota = cgroup_cpu_quota(cgroup_root=cgroup_root, proc_cgroup=proc_cgroup)
    uname = os.uname()
    return HostProbe(
        hostname=uname.nodename,
        usable_cores=usable,
        free_cores=free_cores_of(usable, loads[0] if loads else 0.0),
        cpu_count=os.cpu_count(),
        cpu_quota=quota[0] / quota[1] if quota else None,
        load_average=loads,
        mem_total_mb=total,
        mem_available_mb=available,
        executable=sys.executable,
        python_version=".".join(map(str, sys.version_info[:3])),
        implementation=sys.implementation.name,
        platform=sys.platform,
        machine=uname.machine,
        elsewhere_version=_elsewhere_version(),
    )


def usable_cores(*, cgroup_root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup") -> int:
    """Cores this process may use: its CPU affinity, cut to its cgroup's CPU quota, at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no affinity
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root=cgroup_root, proc_cgroup=proc_cgroup)
    if quota is not None:
        cores = min(cores, -(-quota[0] // quota[1]))  # a fractional quota is rounded up
    return max(1, cores)


def free_cores(*, cgroup_root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup") -> int:
    """Cores not busy now: :func:`usable_cores` minus the 1-minute load average, at least 1."""
    return free_cores_of(usable_cores(cgroup_root=cgroup_root, proc_cgroup=proc_cgroup),
                         _load_1min())


def free_cores_of(usable: int, load: float) -> int:
    """``usable`` cores minus the 1-minute ``load``, rounded, from 1 to ``usable``."""
    return max(1, min(usable, round(usable - load)))


def _load_1min() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


# -- cgroups ------------------------------------------------------------------------------------


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` as {controller: path}; the v2 (unified) line's key is ``""``.

    ``"4:cpu,cpuacct:/user.slice"`` gives ``{"cpu": "/user.slice", "cpuacct": "/user.slice"}``;
    lines that do not have three fields are skipped.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        _, controllers, path = parts
        if not controllers:
            out[""] = path
        for name in controllers.split(","):
            if name:
                out[name] = path
    return out


def parse_cpu_max(text: str) -> tuple[int, int] | None:
    """cgroup v2 ``cpu.max`` (``"150000 100000"``) as (quota, period) in µs; None for ``max``."""
    words = text.split()
    if not words or words[0] == "max":
        return None
    try:
        quota = int(words[0])
        period = int(words[1]) if len(words) > 1 else 100_000
    except ValueError:
        return None
    return (quota, period) if quota > 0 and period > 0 else None


def parse_cfs_quota(quota_text: str, period_text: str) -> tuple[int, int] | None:
    """cgroup v1 ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` as (quota, period); None for -1."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError:
        return None
    return (quota, period) if quota > 0 and period > 0 else None


def cgroup_cpu_quota(
    *, cgroup_root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup"
) -> tuple[int, int] | None:
    """The tightest CPU quota on this process's cgroup and its parents, as (quota, period) µs.

    cgroup v2 (``cpu.max``) where it is mounted with the cpu controller, else cgroup v1
    (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); None where no quota is set or no
    cgroup file can be read.
    """
    paths = _read_proc_cgroup(proc_cgroup)
    found = []
    for folder in _cgroup_dirs(cgroup_root, paths, None):
        found.append(parse_cpu_max(_read(os.path.join(folder, "cpu.max")) or "max"))
    for folder in _cgroup_dirs(cgroup_root, paths, "cpu"):
        quota = _read(os.path.join(folder, "cpu.cfs_quota_us"))
        period = _read(os.path.join(folder, "cpu.cfs_period_us"))
        if quota is not None and period is not None:
            found.append(parse_cfs_quota(quota, period))
    quotas = [q for q in found if q is not None]
    return min(quotas, key=lambda q: q[0] / q[1]) if quotas else None


def cgroup_memory_limit(
    *, cgroup_root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup"
) -> tuple[int | None, int | None]:
    """(limit, used) in bytes of the tightest memory limit on this process's cgroup and its
    parents (v2 ``memory.max`` / ``memory.current``, v1 ``memory.limit_in_bytes`` /
    ``memory.usage_in_bytes``; used leaves out inactive file cache, as ``memory.stat``
    gives it); (None, None) where no limit is set."""
    paths = _read_proc_cgroup(proc_cgroup)
    best: tuple[int, int | None] | None = None
    for folder, limit_name, usage_name in [
        *((f, "memory.max", "memory.current") for f in _cgroup_dirs(cgroup_root, paths, None)),
        *(
            (f, "memory.limit_in_bytes", "memory.usage_in_bytes")
            for f in _cgroup_dirs(cgroup_root, paths, "memory")
        ),
    ]:
        limit = _int((_read(os.path.join(folder, limit_name)) or "").strip())
        if limit is None or limit <= 0 or limit >= _NO_LIMIT_BYTES:
            continue
        if best is None or limit < best[0]:
            best = (limit, _cgroup_memory_used(folder, usage_name))
    return best if best is not None else (None, None)


def _cgroup_memory_used(folder: str, usage_name: str) -> int | None:
    """A cgroup's memory in use, less the file cache the kernel drops first under its limit
    (as MemAvailable counts that cache as available)."""
    usage = _int((_read(os.path.join(folder, usage_name)) or "").strip())
    if usage is None:
        return None
    for line in (_read(os.path.join(folder, "memory.stat")) or "").splitlines():
        key, _, value = line.partition(" ")
        if key in ("inactive_file", "total_inactive_file"):
            cache = _int(value.strip())
            if cache is not None:
                return max(0, usage - cache)
    return usage


def _cgroup_dirs(root: str, paths: dict[str, str], controller: str | None) -> list[str]:
    """The cgroup folders of ``controller`` (None: the v2 hierarchy) that exist, from this
    process's own up to the hierarchy's root.

    In a container the path in /proc/self/cgroup may name the host's hierarchy, which the
    container sees mounted at its root: the folders that do not exist are skipped.
    """
    if controller is None:
        mounts = [root] if os.path.exists(os.path.join(root, "cgroup.controllers")) else []
        mounts.append(os.path.join(root, "unified"))
        path = paths.get("", "/")
    else:
        # v1 mounts one controller per folder, or several joined ("cpu,cpuacct")
        mounts = [os.path.join(root, controller)]
        if not os.path.isdir(mounts[0]):
            try:
                mounts += sorted(
                    os.path.join(root, name)
                    for name in os.listdir(root)
                    if "," in name and controller in name.split(",")
                )
            except OSError:
                pass
        path = paths.get(controller, "/")
    out: list[str] = []
    for mount in mounts:
        if not os.path.isdir(mount) or (controller is None and not _is_v2(mount)):
            continue
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        for depth in range(len(parts), -1, -1):
            folder = os.path.join(mount, *parts[:depth])
            if os.path.isdir(folder) and folder not in out:
                out.append(folder)
        if out:
            break
    return out


def _is_v2(folder: str) -> bool:
    return os.path.exists(os.path.join(folder, "cgroup.controllers"))


def _read_proc_cgroup(path: str) -> dict[str, str]:
    return parse_proc_cgroup(_read(path) or "")


# -- memory, elsewhere --------------------------------------------------------------------------


def _memory_mb(meminfo: str) -> tuple[int | None, int | None]:
    """(total, available) MiB of the machine: /proc/meminfo, else psutil, else sysconf."""
    text = _read(meminfo)
    if text:
        fields: dict[str, int] = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            words = rest.split()
            if words and words[0].isdigit():
                fields[key.strip()] = int(words[0]) // 1024  # kB
        if "MemTotal" in fields:
            return fields["MemTotal"], fields.get("MemAvailable", fields.get("MemFree"))
    try:
        import psutil  # only where there is no /proc/meminfo (macOS, the BSDs)

        vm = psutil.virtual_memory()
        return int(vm.total) // _MB, int(vm.available) // _MB
    except Exception:  # not installed, or it cannot read this system either
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page // _MB
    except (AttributeError, OSError, ValueError):
        return None, None
    try:
        available: int | None = os.sysconf("SC_AVPHYS_PAGES") * page // _MB
    except (OSError, ValueError):
        available = None
    return total, available


def _elsewhere_version() -> str | None:
    """The version of the elsewhere this interpreter runs or would import, or None."""
    running = sys.modules.get("elsewhere")
    if running is not None:
        return str(getattr(running, "__version__", "unknown"))
    import importlib.util

    try:
        if importlib.util.find_spec("elsewhere") is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        from importlib.metadata import version

        return version("elsewhere")
    except Exception:  # no metadata: on PYTHONPATH without being installed
        pass
    try:
        from elsewhere.util.version import __version__

        return str(__version__)
    except ImportError:  # an elsewhere of another layout, or another package of that name
        return "unknown"
    except Exception:  # importable in name only: broken
        return None


def _read(path: str) -> str | None:
    """The text of a small file (/proc, /sys), or None; without io's layers (each costs)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        while True:
            block = os.read(fd, 65536)
            if not block:
                break
            chunks.append(block)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _str_or_none(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def main() -> int:
    """Print this host's probe as one marked JSON line (login banners may come before it)."""
    import json

    sys.stdout.write("\n" + MARKER + json.dumps(probe_host().to_dict()) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
