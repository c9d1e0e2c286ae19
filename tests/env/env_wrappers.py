"""Helpers of the python= tests: a wrapper that stands in for a container runtime, and podman.

``fake-container exec IMAGE COMMAND [ARG...]`` behaves as ``apptainer exec`` does for what
elsewhere needs: it records that it ran (its pid, the image and the command it was given, one
tab-separated line in its log), exports ``FAKE_CONTAINER_IMAGE=IMAGE`` (so a task can tell it
runs "inside") and execs the rest. It is a POSIX shell script, as a runtime is no Python
program; its log's path is written into it, because an ssh session or a batch job does not
carry this process's environment.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

#: An image name with spaces, both kinds of quotes and shell characters: each must arrive as is.
ODD_IMAGE = 'my images/it\'s a "test" $HOME `id`; x.sif'

_SCRIPT = """#!/bin/sh
# fake-container exec IMAGE COMMAND [ARG...]: stands in for a container runtime.
if [ "$1" != exec ] || [ $# -lt 3 ]; then
    echo "usage: fake-container exec IMAGE COMMAND [ARG...]" >&2
    exit 2
fi
image=$2
shift 2
# one short line (one write, so that wrappers running at once do not mix their lines)
line=$(printf '%s\\t%s\\t%s' "$$" "$image" "$*" | tr '\\n' ' ' | cut -c1-300)
printf '%s\\n' "$line" >> LOG
FAKE_CONTAINER_IMAGE=$image
export FAKE_CONTAINER_IMAGE
exec "$@"
"""


def inside(x):
    """A task: its input, the image it ran in, the setup's mark (None when absent)."""
    return x, os.environ.get("FAKE_CONTAINER_IMAGE"), os.environ.get("EW_SETUP_MARK")


@dataclass(frozen=True)
class FakeContainer:
    """The wrapper script and its log."""

    path: Path
    log: Path

    @classmethod
    def make(cls, folder: Path) -> FakeContainer:
        """A fresh wrapper in ``folder/container bin/`` (a space in its path), logging to
        ``folder/fake-container.log``."""
        bin_dir = folder / "container bin"
        bin_dir.mkdir(parents=True)
        log = folder / "fake-container.log"
        path = bin_dir / "fake-container"
        path.write_text(_SCRIPT.replace("LOG", shlex.quote(str(log))))
        path.chmod(0o755)
        return cls(path, log)

    def runs(self) -> list[tuple[int, str, str]]:
        """Each run so far: (pid, image, the start of the command it exec'd: its words joined
        by spaces, newlines as spaces, at most 300 characters in all)."""
        if not self.log.exists():
            return []
        rows = []
        for line in self.log.read_text().splitlines():
            pid, image, command = line.split("\t", 2)
            rows.append((int(pid), image, command))
        return rows

    def command(self, image: str, python: str = sys.executable) -> str:
        """``python=`` that runs ``python`` through the wrapper with ``image``, as a string."""
        return shlex.join([str(self.path), "exec", image, python])


# -- podman ---------------------------------------------------------------------------------

#: What podman needs on this kind of machine (a VM with hybrid cgroups, a low open-files cap,
#: no image registry): runc (crun refuses hybrid cgroups), limits within the caller's, the
#: host's pids (elsewhere follows workers by pid) and network, the variables a worker reads
#: (and EW_CONTAINER, which tells a task it runs inside), and a root file system made of the
#: host's /usr rather than an image.
PODMAN_OPTIONS = [
    "--runtime", "runc", "run", "--rm", "-i",
    "--ulimit", "nofile=1024:4096", "--ulimit", "nproc=4096:4096",
    "--pid", "host", "--network", "host",
    "-e", "ELSEWHERE_*", "-e", "PYTHON*", "-e", "SLURM_*", "-e", "EW_CONTAINER=podman",
]  # fmt: skip


def podman_rootfs(folder: Path) -> Path:
    """A root file system for ``podman run --rootfs``: empty folders and the merged-/usr
    links; /usr and the folders elsewhere needs are bound in by :func:`podman_command`."""
    root = folder / "rootfs"
    for sub in ("usr", "etc", "proc", "sys", "dev", "tmp", "root", "work"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "lib", "lib64", "sbin"):
        if not (root / link).is_symlink():
            (root / link).symlink_to(f"usr/{link}")
    return root


def podman_command(root: Path, mounts: list[str], python: str = sys.executable) -> list[str]:
    """``python=`` as a list: ``podman ... --rootfs ROOT PYTHON``, ``mounts`` bound at the
    same paths (read-write), /usr and /etc read-only."""
    argv = ["podman", *PODMAN_OPTIONS, "-v", "/usr:/usr:ro", "-v", "/etc:/etc:ro"]
    for m in mounts:
        argv += ["-v", f"{m}:{m}"]
    return [*argv, "--rootfs", str(root), python]


def python_prefixes() -> list[str]:
    """Folders this interpreter, its venv and this checkout live in (to bind into a container)."""
    real = Path(sys.executable).resolve()
    here = Path(__file__).resolve().parents[2]
    return sorted({str(real.parents[1]), str(Path(sys.prefix)), str(here)})
