"""elsewhere.hosts re-exports its public names, and only names that exist."""

from __future__ import annotations

import inspect
import subprocess
import sys

import elsewhere.hosts as remote
from elsewhere.hosts import (
    interpreter,
    local,
    openssh,
    probe,
    session,
    spawn,
    ssh,
    sshcopy,
    sync,
    transport,
    tree,
)

# names that stay in their own module: the tree code, the probe's parsers, spawn's pieces
NOT_REEXPORTED = {
    "TREE_SCRIPT", "tree_functions", "copy_path", "check_destination", "SSHCopies",
    "CGROUP_ROOT", "MARKER", "cgroup_cpu_quota", "cgroup_memory_limit", "free_cores", "free_cores_of",
    "parse_cfs_quota", "parse_cpu_max", "parse_proc_cgroup", "package_root", "python_env",
    "python_path",
}


def test_all_is_complete_and_importable() -> None:
    for name in remote.__all__:
        assert hasattr(remote, name), name
    for module in (transport, local, ssh, openssh, sshcopy, tree, session, probe, interpreter,
                   spawn, sync):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name} does not exist"
            if name not in NOT_REEXPORTED:
                assert name in remote.__all__, f"{module.__name__}.{name} is not re-exported"


def test_the_names_of_the_modules_before_the_split_still_import() -> None:
    from elsewhere.hosts.local import TREE_SCRIPT, tree_functions
    from elsewhere.hosts.ssh import build_remote_command, build_rsync_rsh, parse_ssh_failure

    assert TREE_SCRIPT is tree.TREE_SCRIPT and tree_functions is tree.tree_functions
    assert build_remote_command is openssh.build_remote_command
    assert build_rsync_rsh is openssh.build_rsync_rsh
    assert parse_ssh_failure is openssh.parse_ssh_failure


def test_importing_the_probe_imports_no_other_room() -> None:
    code = ("import sys, elsewhere.hosts.probe; "
            "print(sorted(m for m in sys.modules if m.startswith('elsewhere.hosts.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "['elsewhere.hosts.probe']"


def test_public_names_have_docstrings() -> None:
    for name in remote.__all__:
        obj = getattr(remote, name)
        assert inspect.getdoc(obj), f"{name} has no docstring"
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and callable(member):
                    assert inspect.getdoc(member), f"{name}.{attr} has no docstring"
