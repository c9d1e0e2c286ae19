"""``elsewhere doctor``: can a profile or an ssh host run tasks, and if not, what to fix.

    >>> from elsewhere.api.doctor import diagnose, format_report
    >>> print(format_report(diagnose("helix")))                    # doctest: +SKIP
    >>> print(format_report(diagnose("user@server1", python="/opt/py/bin/python3")))  # doctest: +SKIP

The target is a profile name (``[profiles.NAME]`` in config.toml), ``"local"``, or an ssh
destination as typed after ``ssh``. Each check is one :class:`Check`; a failed one always
says what to do. In order (a host that cannot be reached skips the rest of its checks):

=============  ==================================================================
``profile``    the profile parses into a cluster (profiles only)
``ssh``        the host answers, accepts our key, and its host key is known; a
               failure names its class (HostUnreachable, AuthenticationError,
               HostKeyError) and the transport's advice
``python``     the interpreter runs there, Python >= 3.10 and the same X.Y as here
               (functions from scripts and notebooks travel as bytecode)
``elsewhere``  importable by that interpreter, same major version as here
``cores``      cores usable there (>= cores_per_task; >= the cores a profile asks for)
``memory``     memory available there (>= 256 MiB)
``storage``    the job-copy folder can be made and written
``scheduler``  batch: the submit, status and cancel commands are on PATH where
               commands run (here, or the login node ``host=``)
``template``   batch: the job-script template renders with the profile's settings
=============  ==================================================================

Batch clusters skip ``cores`` and ``memory``: their tasks run on compute nodes, not on the
login node that doctor reaches. A host is asked with one ssh connection (opened and closed
here) and a handful of commands over it.
"""

from __future__ import annotations

import platform
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..util.command import PythonCommand, PythonSpec
from ..util.errors import (
    AuthenticationError,
    ConfigError,
    ElsewhereError,
    HostKeyError,
    HostUnreachable,
    TransportError,
)
from ..util.version import __version__

__all__ = ["MIN_MEMORY_MB", "MIN_PYTHON", "Check", "diagnose", "format_report"]

#: Less available memory than this on a host is reported as a problem.
MIN_MEMORY_MB = 256
#: The oldest Python elsewhere runs on (pyproject's requires-python).
MIN_PYTHON = (3, 10)

# mkdir -p (private, whatever the umask), write and remove a file, print the real path: sh
# only, no Python needed.
_STORAGE_SCRIPT = (
    'umask 077 && mkdir -p -- "$1" && cd -- "$1" && t=".ew-doctor-$$" && : >"$t" '
    '&& rm -f -- "$t" && pwd -P'
)


@dataclass(frozen=True)
class Check:
    """One finding of :func:`diagnose`.

    Attributes:
        name: what was checked ("ssh", "python", ...; prefixed "HOST " when a profile has
            several nodes).
        ok: whether it is fine.
        detail: what was found, in one line.
        fix: what to do about it; empty only when ``ok``.
    """

    name: str
    ok: bool
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a Check needs a name")
        if not self.ok and not self.fix:
            raise ConfigError(f"check {self.name!r} failed without saying what to fix")


def diagnose(
    target: str,
    *,
    python: str | None = None,
    remote_storage: str | None = None,
    ssh_config: str | None = None,
    ssh_options: Sequence[str] = (),
    cores_per_task: int = 1,
    connect_timeout_s: float = 10.0,
) -> list[Check]:
    """Check that ``target`` can run elsewhere's tasks; one :class:`Check` per finding.

    ``target``: a profile name, ``"local"``, or an ssh destination (``"host"``,
    ``"user@host"``, an alias of the ssh config). The keyword arguments describe an ssh
    destination the way ``ew.ssh`` would use it; a profile brings its own settings.
    Never raises for a problem it finds: that is a failed check.
    """
    from .profiles import config_file, read_profiles

    try:
        profiles = read_profiles()
    except ConfigError as exc:
        return [Check("profile", False, str(exc), f"correct {config_file()}")]
    if target in profiles:
        return _diagnose_profile(target, dict(profiles[target]), connect_timeout_s)
    if target == "local":
        return _diagnose_local(python=python, storage=None, cores_per_task=cores_per_task)
    from ..backends.ssh import DEFAULT_REMOTE_STORAGE

    return _diagnose_host(
        target, python=python or "python3", remote_storage=remote_storage or DEFAULT_REMOTE_STORAGE,
        ssh_config=ssh_config, ssh_options=ssh_options, cores_per_task=cores_per_task,
        cores=None, connect_timeout_s=connect_timeout_s)


def format_report(checks: Sequence[Check], *, title: str | None = None) -> str:
    """The checks as text: one line each, then the fixes, numbered; or that all is well."""
    width = max((len(c.name) for c in checks), default=0)
    lines = [f"elsewhere doctor: {title}"] if title else []
    for c in checks:
        lines.append(f"  {'ok  ' if c.ok else 'FAIL'}  {c.name.ljust(width)}  {c.detail}")
    failed = [c for c in checks if not c.ok]
    if not checks:
        lines.append("nothing was checked")
    elif not failed:
        lines.append(f"all {len(checks)} checks passed")
    else:
        lines.append("")
        lines.append(f"{len(failed)} problem{'s' if len(failed) > 1 else ''} to fix:")
        for i, c in enumerate(failed, 1):
            lines.append(f"  {i}. {c.name}: {c.fix}")
    return "\n".join(lines)


# -- profiles -----------------------------------------------------------------------------


def _diagnose_profile(name: str, settings: dict[str, Any], connect_timeout_s: float) -> list[Check]:
    from ..backends import cluster_class
    from ..backends.batch import BatchCluster
    from .profiles import config_file

    kind = settings.pop("scheduler", None) or settings.pop("kind", None)
    where = f"[profiles.{name}] in {config_file()}"
    if not kind:
        return [Check("profile", False, f"{where} names no scheduler",
                      f'add scheduler = "ssh" (or "slurm", "local", ...) to {where}')]
    try:
        cls = cluster_class(str(kind))
        if issubclass(cls, BatchCluster):
            cluster: Any = cls(check=False, **settings)  # doctor reports what post_construct raises
        else:
            cluster = cls(**settings)
    except (ElsewhereError, TypeError, ValueError) as exc:
        return [Check("profile", False, f"{where}: {str(exc).splitlines()[0]}",
                      f"correct {where} (see help(elsewhere.{kind}) for its settings)")]
    first = Check("profile", True, f"{name}: a {kind} cluster ({where})")
    if isinstance(cluster, BatchCluster):
        return [first, *_diagnose_batch(cluster)]
    if kind == "ssh":
        checks = [first]
        several = len(cluster.nodes) > 1
        for node, cores in cluster.nodes.items():
            found = _diagnose_host(
                node, python=cluster.python_for(node), remote_storage=cluster.remote_storage,
                ssh_config=cluster.ssh_config, ssh_options=cluster.ssh_options,
                cores_per_task=cluster.cores_per_task, cores=cores,
                connect_timeout_s=connect_timeout_s)
            checks += [replace(c, name=f"{node} {c.name}") for c in found] if several else found
        return checks
    if kind == "local":
        return [first, *_diagnose_local(python=cluster.command, storage=cluster.storage,
                                        cores_per_task=cluster.cores_per_task)]
    return [first]  # a user's own backend: nothing generic to check beyond building it


# -- one host over ssh ----------------------------------------------------------------------


def _diagnose_host(
    destination: str, *, python: str, remote_storage: str, ssh_config: str | None,
    ssh_options: Sequence[str], cores_per_task: int, cores: int | None, connect_timeout_s: float,
) -> list[Check]:
    from ..hosts.ssh import SSHTransport

    try:
        transport = SSHTransport(destination, ssh_config=ssh_config, ssh_options=ssh_options,
                                 connect_timeout_s=connect_timeout_s)
    except ConfigError as exc:
        return [Check("ssh", False, str(exc).splitlines()[0],
                      "give the host as after `ssh`: host, user@host or a Host alias of your ssh config")]
    try:
        reach = _check_ssh(transport, ssh_config, ssh_options, connect_timeout_s)
        if not reach.ok:
            return [reach]
        checks = [reach]
        info, python_checks = _check_python(transport, python, [], f"on {destination}")
        checks += python_checks
        if info is not None:
            checks += _check_resources(info, destination, cores_per_task, cores)
        checks.append(_check_storage(transport, remote_storage, destination, "remote_storage="))
        return checks
    finally:
        transport.close()


def _ssh_command(destination: str, ssh_config: str | None, ssh_options: Sequence[str]) -> str:
    words = ["ssh"]
    if ssh_config:
        words += ["-F", ssh_config]
    for opt in ssh_options:
        words += ["-o", opt]
    return " ".join(shlex.quote(w) for w in [*words, destination, "true"])


def _check_ssh(transport: Any, ssh_config: str | None, ssh_options: Sequence[str],
               connect_timeout_s: float) -> Check:
    by_hand = _ssh_command(transport.destination, ssh_config, ssh_options)
    t0 = time.monotonic()
    try:
        res = transport.run(["sh", "-c", 'echo "$(id -un)@$(hostname)"'], check=False,
                            timeout=connect_timeout_s + 30)
    except (HostUnreachable, AuthenticationError, HostKeyError) as exc:
        said = _last_line(exc.stderr) or str(exc).splitlines()[0]
        advice = str(exc).splitlines()[0].rstrip()
        sep = " " if advice.endswith((".", "?", "!")) else ". "
        return Check("ssh", False, f"{type(exc).__name__}: {said}",
                     f"{advice}{sep}Try `{by_hand}` in a shell: it must work without a prompt")
    except TransportError as exc:
        return Check("ssh", False, f"{type(exc).__name__}: {str(exc).splitlines()[0]}",
                     f"try `{by_hand}` in a shell: it must work without a prompt")
    who = res.text.strip().splitlines()[-1] if res.ok and res.text.strip() else transport.destination
    return Check("ssh", True, f"{who} answered in {time.monotonic() - t0:.2f} s "
                              f"(key login, known host key)")


def _check_python(transport: Any, python: PythonSpec, setup: Sequence[str],
                  where: str) -> tuple[dict[str, Any] | None, list[Check]]:
    """The ``python`` and ``elsewhere`` checks, run through ``python=`` as the workers are
    (after the shell lines ``setup``); the interpreter's facts when it ran."""
    from ..hosts.interpreter import remote_python_info

    try:
        command = PythonCommand.parse(python).with_setup(setup)
    except ConfigError as exc:
        return None, [Check("python", False, str(exc).splitlines()[0],
                            "give python= an interpreter, or a command line that ends in one")]
    shown = command.text
    try:
        info = remote_python_info(transport, command, timeout=120)
    except (HostUnreachable, AuthenticationError, HostKeyError) as exc:
        return None, [Check("ssh", False, f"{type(exc).__name__} {where}: {str(exc).splitlines()[0]}",
                            "the connection dropped while checking: run doctor again")]
    except TransportError as exc:
        said = "not found" if exc.returncode in (126, 127) else (
            _last_line(exc.stderr) or str(exc).splitlines()[0])
        return None, [Check("python", False, f"{shown} {where}: {said}",
                            "install Python 3 there, or name the interpreter by its full path "
                            "(python='/usr/bin/python3'; for ssh nodes one per node: "
                            "python={'host': '/path/to/python3'})")]
    checks = []
    theirs = str(info.get("python_version") or "?")
    here = platform.python_version()
    exe = info.get("executable") or shown
    try:
        version = tuple(int(x) for x in theirs.split(".")[:2])
    except ValueError:
        version = (0, 0)
    if version < MIN_PYTHON:
        checks.append(Check("python", False, f"Python {theirs} at {exe} {where}",
                            f"elsewhere needs Python >= {'.'.join(map(str, MIN_PYTHON))}: "
                            "give python= a newer interpreter there"))
    elif version != tuple(sys.version_info[:2]):
        checks.append(Check(
            "python", False, f"Python {theirs} at {exe} {where}, {here} here",
            f"use Python {sys.version_info[0]}.{sys.version_info[1]} on both sides (python= there, "
            "or another interpreter here): functions defined in scripts and notebooks travel as "
            "bytecode, which only the same Python X.Y runs"))
    else:
        checks.append(Check("python", True, f"Python {theirs} at {exe} {where}"))
    ew = info.get("elsewhere_version")
    install = f"`{shown} -m pip install 'elsewhere=={__version__}'`"
    if not ew:
        checks.append(Check("elsewhere", False, f"not installed for {exe} {where}",
                            f"run {install} {where}, or give python= an interpreter that has it"))
    elif str(ew).split(".")[0] != __version__.split(".")[0]:
        checks.append(Check("elsewhere", False, f"elsewhere {ew} {where}, {__version__} here",
                            f"install the same major version: {install} {where}"))
    else:
        same = "" if where == "here" else f" ({__version__} here)"
        checks.append(Check("elsewhere", True, f"elsewhere {ew} {where}{same}"))
    return info, checks


def _check_resources(info: Mapping[str, Any], where: str, cores_per_task: int,
                     cores: int | None) -> list[Check]:
    from ..hosts.probe import HostProbe

    found = HostProbe.from_dict(info)  # the host's probe: affinity, then cgroup quotas
    usable, free = found.usable_cores, found.free_cores
    load = found.load_average[0] if found.load_average else 0.0
    detail = f"{usable} usable on {where}, load {load:.2f}: about {free} free"
    if free < cores_per_task:
        detail += " (busy now: tasks will share cores)"
    if cores_per_task > usable:
        cores_check = Check("cores", False, detail + f"; each task asks for {cores_per_task}",
                            f"lower cores_per_task to at most {usable}, or use a bigger host")
    elif cores is not None and cores > usable:
        cores_check = Check("cores", False, detail + f"; the profile asks for {cores}",
                            f"ask for at most {usable} cores on {where}")
    else:
        cores_check = Check("cores", True, detail)
    avail, total = info.get("mem_available_mb"), info.get("mem_total_mb")
    if avail is None:
        mem_check = Check("memory", True, f"unknown on {where} (no /proc/meminfo, no psutil)")
    elif avail < MIN_MEMORY_MB:
        mem_check = Check("memory", False, f"{avail} MiB available of {total} MiB on {where}",
                          f"free memory on {where} (stop what uses it) or use another host")
    else:
        mem_check = Check("memory", True, f"{avail} MiB available of {total} MiB on {where}")
    return [cores_check, mem_check]


def _check_storage(transport: Any, folder: str, where: str, setting: str) -> Check:
    try:
        res = transport.run(["sh", "-c", _STORAGE_SCRIPT, "sh", folder], check=False, timeout=60)
    except TransportError as exc:
        return Check("storage", False, f"{folder} on {where}: {str(exc).splitlines()[0]}",
                     "check the connection, then run doctor again")
    if res.ok and res.text.strip():
        return Check("storage", True, f"{res.text.strip().splitlines()[-1]} on {where} is writable")
    said = _last_line(res.stderr.decode("utf-8", "replace")) or f"exit code {res.returncode}"
    return Check("storage", False, f"cannot write to {folder} on {where}: {said}",
                 f"give {setting} a folder you can write to on {where} "
                 "(a relative path is under your home there)")


# -- this machine and batch clusters --------------------------------------------------------


def _diagnose_local(*, python: PythonSpec | None, storage: Any, cores_per_task: int) -> list[Check]:
    from ..hosts.local import LocalTransport
    from ..util import paths

    transport = LocalTransport()
    info, checks = _check_python(transport, python or [sys.executable], [], "here")
    if info is not None:
        checks += _check_resources(info, "this machine", cores_per_task, None)
    checks.append(_check_storage(transport, str(storage or paths.default_storage()), "this machine",
                                 "storage="))
    return checks


def _diagnose_batch(cluster: Any) -> list[Check]:
    from ..util import paths

    where = cluster.host or "this machine"
    transport = cluster.transport
    try:
        checks: list[Check] = []
        if cluster.host:
            reach = _check_ssh(transport, cluster.ssh_config, cluster.ssh_options,
                               transport.connect_timeout_s)
            checks.append(reach)
            if not reach.ok:
                return [*checks, _check_template(cluster)]
        checks += _check_python(transport, cluster.python_command(), cluster.env_setup,
                                f"on {where}")[1]
        if cluster.remote_storage:
            checks.append(_check_storage(transport, cluster.remote_storage, where,
                                         "remote_storage="))
        else:
            from ..hosts.local import LocalTransport

            local = str(cluster.storage or paths.default_storage())
            checks.append(_check_storage(LocalTransport(), local, "this machine (shared with the "
                                         "compute nodes)", "storage="))
        checks.append(_check_scheduler(cluster, transport, where))
        checks.append(_check_template(cluster))
        return checks
    finally:
        transport.close()


def _check_scheduler(cluster: Any, transport: Any, where: str) -> Check:
    syntax = cluster.syntax
    wanted = dict.fromkeys([syntax.submit_command, syntax.status_command, syntax.cancel_command])
    found: list[str] = []
    missing: list[str] = []
    for cmd in wanted:
        try:
            path = transport.which(cmd)
        except TransportError as exc:
            return Check("scheduler", False, f"cannot look for {cmd} on {where}: "
                         f"{str(exc).splitlines()[0]}", "check the connection, then run doctor again")
        (found if path else missing).append(path or cmd)
    if missing:
        return Check(
            "scheduler", False, f"{', '.join(missing)} not on PATH on {where} "
            f"(found: {', '.join(found) or 'none'})",
            f"run doctor against a {cluster.kind} submit host (host= a login node), or make "
            f"{', '.join(missing)} reachable there without a login shell (PATH in ~/.bashrc "
            "before its interactive-only guard)")
    return Check("scheduler", True, f"{cluster.kind}: {', '.join(found)} on {where}")


def _check_template(cluster: Any) -> Check:
    from ..schedulers.syntax import ScriptContext

    label = f"template {cluster.template!r}" if cluster.template else f"built-in {cluster.kind} template"
    if cluster.template and "\n" in cluster.template:
        label = "the profile's own template text"
    try:
        command = cluster.python_command()
        ctx = ScriptContext(
            job_name="doctor", run_line=command.shell("-m", "elsewhere.worker", "--job", "/tmp/doctor"),
            log_dir="/tmp/doctor/logs", array_size=2, array_first=cluster.syntax.array_index_base,
            max_running=cluster.max_running, cores_per_task=cluster.cores_per_task,
            mem_per_core_mb=cluster.mem_per_core_mb, walltime_s=cluster.walltime_s,
            queue=cluster.queue, account=cluster.account, qos=cluster.qos, gpus=cluster.gpus,
            env_setup=[*cluster.env_setup, *command.setup], env={"PYTHONUNBUFFERED": "1"},
            additional=cluster.additional_properties)
        text = cluster.syntax.render_script(ctx, cluster._template_text())
    except Exception as exc:  # jinja2, ConfigError, a user's template: all are findings
        name = cluster.template if cluster.template and "\n" not in cluster.template else cluster.kind
        return Check("template", False, f"{label} does not render: {str(exc).splitlines()[0]}",
                     f"correct it (`elsewhere template show {name}`, `elsewhere template edit "
                     f"{name}`), or drop template= to use the built-in one")
    return Check("template", True, f"{label} renders ({len(text.splitlines())} lines)")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
