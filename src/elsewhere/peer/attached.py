"""A job's ``files=`` on the peer network: packed once by the controller, unpacked
once per job by each worker's child.

The job's ``files/`` folder travels as a tar stream (the tree code the ssh
transport uses: member names that leave the folder and links that point out of
it are refused when unpacked, each file is written under a temporary name and
renamed) inside the job's *job part* (with the job data), the part of a TASK a
worker gets once per connection. The child unpacks it into the job's scratch folder on that
machine, which is the tasks' working directory when the caller's does not exist
there, and is put in front of ``sys.path``, as the job's ``files/`` folder is
for the tasks of every other backend.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
from pathlib import Path
from typing import Any

from ..util.errors import ConfigError

__all__ = ["MAX_FILES_BYTES", "pack_files", "unpack_files"]

MAX_FILES_BYTES = 1 << 30
"""The most a job's files may weigh on the peer network (they go with each connection)."""


@functools.cache
def _tree() -> dict[str, Any]:
    from ..hosts.local import tree_functions

    return tree_functions()


def pack_files(folder: Path) -> tuple[str, bytes] | None:
    """``(digest, tar stream)`` of ``folder`` (a job's ``files/``), None if there is none."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    if size > MAX_FILES_BYTES:
        raise ConfigError(
            f"the job's files= weigh {size / (1 << 30):.1f} GiB, more than the "
            f"{MAX_FILES_BYTES >> 30} GiB peers take (they are sent to every worker): put them "
            "where the workers can read them (a shared file system) and pass their paths"
        )
    out = io.BytesIO()
    _tree()["pack"](str(folder), {"codec": "none", "dir_only": True}, out)
    data = out.getvalue()
    return hashlib.sha256(data).hexdigest()[:32], data


def unpack_files(data: Any, dest: str) -> None:
    """Unpack a stream :func:`pack_files` made into ``dest`` (made if missing)."""
    os.makedirs(dest, mode=0o700, exist_ok=True)
    _tree()["unpack"](dest, io.BytesIO(data))
