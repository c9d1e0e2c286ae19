"""The OpenSSH client's language: the command lines we give it and the failures it reports.

Pure builders and parsers (no processes): :func:`build_remote_command` quotes a command for
the remote login shell, :func:`build_rsync_rsh` quotes ssh's words for ``rsync -e``,
:func:`parse_ssh_failure` classifies ssh's error text and :func:`describe_ssh_failure` turns
that class into the exception to raise and advice in words. :class:`~elsewhere.hosts.ssh.SSHTransport`
runs them.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import stat
import time
from collections.abc import Mapping, Sequence

from elsewhere.hosts.transport import check_argv, check_env
from elsewhere.util.errors import (
    AuthenticationError,
    CommandNotFound,
    ConfigError,
    HostKeyError,
    HostUnreachable,
    TransportError,
)

__all__ = [
    "build_remote_command",
    "build_rsync_rsh",
    "check_destination",
    "describe_ssh_failure",
    "parse_ssh_failure",
]

_NO_MASTER = "elsewhere-no-master-connection"
# For clients only: reached only when the master is gone, and then it fails loudly.
_MUX_ONLY_PROXY = f'sh -c "echo {_NO_MASTER} >&2; exit 255"'
# ssh binds "<ControlPath>.<16 random chars>" first; sun_path is 104 bytes on
# macOS and the BSDs (108 on Linux), the final NUL included.
_SOCKET_PATH_MAX = 104 - 1 - 17
_SAFE_DIR = re.compile(r"[A-Za-z0-9_./+-]+\Z")
# Kills the remote command on timeout where coreutils' timeout exists ($1 = seconds).
_TIMEOUT_WRAPPER = (
    'if command -v timeout >/dev/null 2>&1; then exec timeout -k 5 "$@"; fi; shift; exec "$@"'
)

# (pattern in ssh's stderr, kind); the first match wins, so order matters.
_FAILURES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|host key for .* has changed", re.I), "hostkey-changed"),
    (re.compile(r"Host key verification failed|No \S+ host key is known", re.I), "hostkey-unknown"),
    (re.compile(r"Permission denied|Too many authentication failures|no more authentication methods", re.I), "auth"),
    (re.compile(r"Could not resolve hostname|Name or service not known|nodename nor servname|name resolution", re.I), "resolve"),
    (re.compile(r"Connection refused", re.I), "refused"),
    (re.compile(r"timed out|Connection timeout", re.I), "timeout"),
    (re.compile(r"No route to host|Network is unreachable|Host is down", re.I), "route"),
    (re.compile(r"Connection closed by|Connection reset|kex_exchange_identification|Broken pipe|Timeout, server", re.I), "closed"),
]  # fmt: skip


def parse_ssh_failure(stderr: str) -> str | None:
    """Classify ssh's own error text: ``"hostkey-changed"``, ``"hostkey-unknown"``,
    ``"auth"``, ``"resolve"``, ``"refused"``, ``"timeout"``, ``"route"``,
    ``"closed"``, or None when it is not a connection failure."""
    for pattern, kind in _FAILURES:
        if pattern.search(stderr):
            return kind
    return None


def build_remote_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
) -> str:
    """The command line for the remote login shell: every word ``shlex.quote``-d.

    ``env`` becomes ``env NAME=value ...`` (works in sh, bash, zsh, csh and fish),
    ``cwd`` a leading ``cd dir &&``, ``timeout`` a ``sh -c`` wrapper that runs the
    command under coreutils ``timeout`` where the host has it, so the remote
    process dies too when the local side gives up.
    """
    words = check_argv(argv)
    extra = check_env(env)
    if extra:
        words = ["env", *(f"{name}={value}" for name, value in extra.items()), *words]
    if timeout is not None:
        seconds = str(max(1, math.ceil(timeout)))
        words = ["sh", "-c", _TIMEOUT_WRAPPER, "sh", seconds, *words]
    line = " ".join(shlex.quote(word) for word in words)
    if cwd is not None:
        line = f"cd {shlex.quote(cwd)} && {line}"
    return line


def build_rsync_rsh(ssh_argv: Sequence[str]) -> str:
    """``ssh_argv`` as one string for ``rsync -e``, quoted the way rsync splits it.

    rsync splits on spaces, honours single and double quotes, and reads a
    doubled quote inside quotes as one literal quote; backslashes mean nothing.
    """
    out = []
    for word in ssh_argv:
        if word and not re.search(r"[\s'\"]", word):
            out.append(word)
        else:
            out.append("'" + word.replace("'", "''") + "'")
    return " ".join(out)


def check_destination(destination: str) -> str:
    """``destination`` if ssh would read it as a host, else ConfigError saying why."""
    if not isinstance(destination, str) or not destination:
        raise ConfigError("destination must be a host name, 'user@host' or a ~/.ssh/config alias")
    if destination.startswith("-"):
        raise ConfigError(f"destination {destination!r} must not start with '-'")
    if any(c.isspace() or ord(c) < 32 for c in destination):
        raise ConfigError(f"destination {destination!r} contains whitespace or control characters")
    if destination.startswith("ssh://"):
        raise ConfigError(f"destination {destination!r}: give 'user@host' and the port as port=")
    host = destination.rsplit("@", 1)[-1]
    if host.count(":") == 1:
        port = host.partition(":")[2]
        raise ConfigError(
            f"destination {destination!r}: 'host:port' is not ssh syntax; "
            f"write SSHTransport({destination.rsplit(':', 1)[0]!r}, port={port or 'N'})"
        )
    return destination


def default_control_dir() -> str:
    """A private folder for master sockets with a short path (sockets need one)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        candidate = os.path.join(runtime, "elsewhere-ssh")
        if len(candidate) <= _SOCKET_PATH_MAX - 24 and _SAFE_DIR.match(candidate):
            return candidate
    return f"/tmp/elsewhere-ssh-{os.getuid()}"


def ensure_private_dir(path: str) -> None:
    """Create ``path`` with mode 0700, or check that it is ours and private."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"ssh control folder {path} is not a folder (a symlink?); remove it")
    if st.st_uid != os.getuid():
        raise ConfigError(
            f"ssh control folder {path} belongs to another user; remove it or pass control_dir="
        )
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


_LOGIN_FAILURES = {c.__name__: c for c in (TransportError, HostUnreachable, AuthenticationError, HostKeyError)}


def note_login_failure(fd: int, exc: TransportError) -> None:
    """Write a master login's failure into its lock file ``fd`` (held): the processes that
    waited for that lock meanwhile take it as their own (:func:`login_failure_since`) rather
    than each trying in turn, a connection timeout apiece, against a host that is down."""
    record = {"at": time.time(), "class": type(exc).__name__, "message": str(exc.args[0]).split("\n  ")[0],
              "command": exc.command, "returncode": exc.returncode, "stderr": exc.stderr[-4000:]}  # fmt: skip
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)


def login_failure_since(fd: int, since: float, host: str) -> TransportError | None:
    """The failure another process noted in the lock file ``fd`` (held) after ``since``, the
    moment this one began to wait for the lock; None if none did (the file is empty after a
    login that worked)."""
    try:
        record = json.loads(os.pread(fd, 1 << 16, 0) or b"null")
        if record is None or float(record["at"]) < since:
            return None
        cls = _LOGIN_FAILURES.get(str(record["class"]), TransportError)
        return cls(f"{record['message']} (a login by another process failed so while this one waited "
                   "for it: not tried again)", host=host, command=record.get("command"),
                   returncode=record.get("returncode"), stderr=str(record.get("stderr") or ""))  # fmt: skip
    except (ValueError, TypeError, KeyError, OSError):
        return None


def describe_ssh_failure(
    kind: str, *, destination: str, port: int | None, connect_timeout_s: float
) -> tuple[type[TransportError], str]:
    """The exception class and the advice for an ssh failure of ``kind``
    (:func:`parse_ssh_failure`'s word) on ``destination``."""
    where = f"{destination} (port {port})" if port else destination
    name = destination.rsplit("@", 1)[-1]
    port_flag = f"-p {port} " if port else ""
    cls: type[TransportError]
    if kind == "hostkey-changed":
        cls, message = (
            HostKeyError,
            (
                f"the host key of {where} has CHANGED since it was recorded: the host was "
                "reinstalled, or someone is in between. Check with its administrator, then "
                f"remove the old key with `ssh-keygen -R {name}` and connect once by hand "
                f"(`ssh {port_flag}{destination}`)"
            ),
        )
    elif kind == "hostkey-unknown":
        cls, message = (
            HostKeyError,
            (
                f"the host key of {where} is not known, and elsewhere never accepts one "
                f"unseen (BatchMode). Add it after checking its fingerprint: "
                f"`ssh-keyscan {port_flag}{name} >> ~/.ssh/known_hosts`, or connect once by hand "
                f"(`ssh {port_flag}{destination}`)"
            ),
        )
    elif kind == "auth":
        cls, message = (
            AuthenticationError,
            (
                f"{where} refused the login: check the user name and your key (`ssh-add -l` "
                "lists the keys the agent offers; the public key must be in "
                "~/.ssh/authorized_keys there). Password and passphrase prompts are off "
                "(BatchMode=yes): load the key into ssh-agent first"
            ),
        )
    else:
        cls = HostUnreachable
        message = {
            "resolve": f"the host name of {where} is not known: check the spelling, "
            "or the Host entries in your ssh config",
            "refused": f"nothing accepts ssh connections at {where}: is sshd running, "
            "and is the port right?",
            "timeout": f"{where} did not answer within {connect_timeout_s:g} s: "
            "check the network, a VPN, a firewall or ProxyJump settings",
            "route": f"there is no network route to {where}: check the network or VPN",
            "closed": f"{where} closed the ssh connection: the server may be overloaded "
            "(MaxStartups), may refuse this client, or the network dropped it",
        }[kind]
    return cls, message


#: The ciphers an ssh connection puts first where the CPU has AES instructions (``ssh -o
#: Ciphers=^...``: ahead of the client's defaults, the rest kept). OpenSSH's first default,
#: ChaCha20-Poly1305, has no hardware help: over the CI machine's loopback sshd, 100 MB
#: took 17 s with it and 7.8 s with AES-128-GCM (loaded; the ratio is the point).
AES_FIRST = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"


def parse_ssh_config_dump(text: str) -> dict[str, str]:
    """``ssh -G``'s output (one ``keyword value`` a line) as ``{keyword: value}``; a keyword
    given more than once (``identityfile``) keeps its first value."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            out.setdefault(key.lower(), value.strip())
    return out


def choose_ciphers(default: Mapping[str, str] | None, preferred: Mapping[str, str] | None,
                   effective: Mapping[str, str] | None) -> str | None:  # fmt: skip
    """The ``Ciphers=`` option a master connection adds, from three ``ssh -G`` dumps: the
    client's defaults (``-F /dev/null``), the same with :data:`AES_FIRST` (None where the
    client refused it: too old for ``^``), and what the user's configuration gives for the
    destination. None (nothing added) where any is missing or the user chose ciphers: a
    ``Ciphers`` line of theirs is kept as it is. The list is the client's own expansion,
    so the running ssh needs no ``^``."""
    if not default or not preferred or not effective:
        return None
    mine, theirs = preferred.get("ciphers"), effective.get("ciphers")
    if not mine or theirs != default.get("ciphers") or mine == theirs:
        return None
    return f"Ciphers={mine}"


def _check_option(option: str) -> str:
    if not isinstance(option, str) or option.startswith("-") or "\n" in option:
        raise ConfigError(f"ssh option {option!r}: give 'Key=value', as after ssh -o")
    if "=" not in option and " " not in option:
        raise ConfigError(f"ssh option {option!r}: give 'Key=value', as after ssh -o")
    return option


def _no_program(name: str, package: str) -> CommandNotFound:
    return CommandNotFound(
        f"`{name}` is not installed here (or not on PATH): install it "
        f"(Debian/Ubuntu: apt-get install {package}; macOS has it)",
        command=[name],
    )
