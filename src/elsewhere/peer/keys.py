"""Group keys: the shared secret that makes a set of peers a group.

A peer network is a group of peers that share one 32-byte secret. Whoever
holds the key can announce itself, be admitted, and run code on every worker
of the group; whoever does not can do neither. Without a key a peer works in
*loopback-only mode*: it binds, announces and connects on 127.0.0.1 only
(:data:`LOOPBACK_ONLY`, :func:`is_loopback_only`).

Key file format (text, UTF-8, mode 0600, owned by the user): the current key, then, after
a rotation (:func:`rotate_key`), the previous keys with the end of their overlap::

    elsewhere-peer-key v1 <group> <base64 of 32 bytes>
    elsewhere-peer-key v1 <group> <base64 of 32 bytes> until <YYYY-MM-DDTHH:MM:SSZ>

Blank lines and lines starting with ``#`` are ignored. ``<group>`` is 1-64
characters out of ``A-Z a-z 0-9 . _ -``. The default location of the key of
group ``g`` is ``platformdirs.user_config_dir("elsewhere")/peer/g.key``.

A peer signs its announcements and offers its handshakes with the current key, and accepts
a previous key too until its time is up (:meth:`GroupKey.accepted`): the *overlap*, in
which the key file reaches every machine of the group. Once it is over, or once the previous
key's line is removed (:func:`drop_previous_keys`), a copy of the old key opens nothing.

Copy the file to every machine of the group by a channel you trust (scp, a
USB stick); never by mail or chat.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import contextlib
import hashlib
import math
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from ..util.errors import ConfigError, PeerError

__all__ = [
    "DEFAULT_GROUP",
    "KEY_BYTES",
    "LOOPBACK_HOST",
    "LOOPBACK_ONLY",
    "GroupKey",
    "check_group_name",
    "default_key_path",
    "drop_previous_keys",
    "find_key",
    "format_key_file",
    "format_time",
    "generate_key",
    "is_loopback_only",
    "load_key",
    "parse_key_file",
    "rotate_key",
    "write_key",
]

KEY_BYTES: Final = 32
"""Length of a group key's secret, in bytes."""

DEFAULT_GROUP: Final = "default"
"""The group a peer joins when none is named."""

LOOPBACK_ONLY: Final = None
"""The "key" of loopback-only mode: pass it where a :class:`GroupKey` is expected."""

LOOPBACK_HOST: Final = "127.0.0.1"
"""The only address a peer without a key binds to, announces on or connects to."""

_MAGIC = "elsewhere-peer-key"
_FORMAT_VERSION = "v1"
_GROUP_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_MAX_PREVIOUS = 4
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def check_group_name(group: str) -> str:
    """Return ``group`` if it is a valid group name, else raise :class:`ConfigError`."""
    if not isinstance(group, str) or not _GROUP_RE.fullmatch(group):
        raise ConfigError(
            f"invalid peer group name {group!r}: use 1-64 characters out of A-Z a-z 0-9 . _ -"
        )
    return group


@dataclass(frozen=True)
class GroupKey:
    """The secret of a peer group, and the group's name.

    ``repr`` never shows the secret; :attr:`fingerprint` names the key without
    revealing it, so that two machines can compare keys. ``previous``: the keys it
    replaced, each ``(secret, until)``, still accepted until ``until`` (seconds since the
    epoch; see :meth:`accepted`). ``source``: the file it was read from, if any.
    """

    group: str
    secret: bytes = field(repr=False)
    previous: tuple[tuple[bytes, float], ...] = field(default=(), repr=False, compare=False)
    source: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        check_group_name(self.group)
        if not isinstance(self.secret, bytes) or len(self.secret) != KEY_BYTES:
            raise ConfigError(f"a group key is {KEY_BYTES} bytes, got {len(self.secret)!r}")
        if len(self.previous) > _MAX_PREVIOUS:
            raise ConfigError(f"at most {_MAX_PREVIOUS} previous keys, got {len(self.previous)}")
        for secret, until in self.previous:
            if not isinstance(secret, bytes) or len(secret) != KEY_BYTES or secret == self.secret:
                raise ConfigError(f"a previous group key is {KEY_BYTES} bytes, other than the current one")
            if not isinstance(until, (int, float)) or math.isnan(until):
                raise ConfigError(f"a previous key's end of overlap must be a time, got {until!r}")

    def accepted(self, now: float | None = None) -> list[GroupKey]:
        """The keys a peer accepts now: this one first, then each previous key whose overlap
        is not over (as keys of their own)."""
        now = time.time() if now is None else now
        return [GroupKey(self.group, self.secret),
                *(GroupKey(self.group, s) for s, until in self.previous if until > now)]  # fmt: skip

    def overlap_ends(self, now: float | None = None) -> float | None:
        """When the last previous key still accepted stops being accepted (None: there is none)."""
        now = time.time() if now is None else now
        return max((until for _s, until in self.previous if until > now), default=None)

    @property
    def fingerprint(self) -> str:
        """A short, non-secret name of the key: 16 hex digits of a hash of it."""
        return hashlib.sha256(b"elsewhere peer key fingerprint\0" + self.secret).hexdigest()[:16]


def generate_key() -> bytes:
    """Return a new random secret of :data:`KEY_BYTES` bytes."""
    return secrets.token_bytes(KEY_BYTES)


def is_loopback_only(key: GroupKey | None) -> bool:
    """True when ``key`` is :data:`LOOPBACK_ONLY` (no key: talk to 127.0.0.1 only)."""
    return key is None


def default_key_path(group: str = DEFAULT_GROUP) -> Path:
    """Where the key of ``group`` lives by default: ``<config dir>/peer/<group>.key`` (the
    user's config folder, or ``$ELSEWHERE_CONFIG``)."""
    from ..util import paths

    check_group_name(group)
    return paths.config_dir() / "peer" / f"{group}.key"


def format_time(t: float) -> str:
    """``t`` (seconds since the epoch) as a key file writes it: UTC, to the second."""
    return time.strftime(_TIME_FORMAT, time.gmtime(t))


def format_key_file(key: GroupKey) -> str:
    """The text of a key file for ``key`` (and its previous keys, each with its end of overlap)."""
    lines = [f"{_MAGIC} {_FORMAT_VERSION} {key.group} {base64.b64encode(key.secret).decode('ascii')}"]
    for secret, until in key.previous:
        encoded = base64.b64encode(secret).decode("ascii")
        lines.append(f"{_MAGIC} {_FORMAT_VERSION} {key.group} {encoded} until {format_time(until)}")
    return "\n".join(lines) + "\n"


def write_key(
    group: str = DEFAULT_GROUP,
    path: str | os.PathLike[str] | None = None,
    *,
    secret: bytes | None = None,
    overwrite: bool = False,
    previous: tuple[tuple[bytes, float], ...] = (),
) -> Path:
    """Write a key file for ``group`` and return its path.

    The file is created with mode 0600 from the start (never readable by
    others, not even for a moment) and appears atomically under its name.
    ``secret`` defaults to a new :func:`generate_key`. An existing file is
    kept, and :class:`ConfigError` raised, unless ``overwrite`` is true.
    Missing parent folders are created with mode 0700. ``previous``: keys it replaces,
    with the end of each one's overlap (see :func:`rotate_key`).
    """
    key = GroupKey(group, generate_key() if secret is None else secret, previous)
    target = Path(path) if path is not None else default_key_path(group)
    from ..util.paths import private_dir

    private_dir(target.parent)
    if target.exists() and not overwrite:
        raise ConfigError(f"key file {target} exists; pass overwrite=True to replace it")
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # a umask such as 0277 would have left 0400
            os.write(fd, format_key_file(key).encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        if overwrite:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)  # fails if the name appeared meanwhile: no overwrite race
            except FileExistsError:
                raise ConfigError(f"key file {target} exists; pass overwrite=True to replace it")
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return target


def parse_key_file(text: str, *, source: str = "key file") -> GroupKey:
    """Parse the text of a key file; raise :class:`ConfigError` naming ``source`` if bad."""
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    current = [ln for ln in lines if len(ln.split()) != 6]
    if len(current) != 1 or len(lines) > 1 + _MAX_PREVIOUS:
        raise ConfigError(f"{source}: expected one line '{_MAGIC} {_FORMAT_VERSION} GROUP KEY' (after a "
                          f"rotation, and at most {_MAX_PREVIOUS} previous keys, each '... until TIME')")  # fmt: skip
    group, secret = _parse_line(current[0].split(), source)
    previous = []
    for line in lines:
        words = line.split()
        if len(words) == 6:
            old_group, old = _parse_line(words[:4], source)
            if old_group != group or words[4] != "until":
                raise ConfigError(f"{source}: a previous key line is '{_MAGIC} {_FORMAT_VERSION} {group} KEY "
                                  "until YYYY-MM-DDTHH:MM:SSZ', of the same group")  # fmt: skip
            try:
                until = calendar.timegm(time.strptime(words[5], _TIME_FORMAT))
            except ValueError:
                raise ConfigError(f"{source}: {words[5]!r} is not a time YYYY-MM-DDTHH:MM:SSZ (UTC)")
            previous.append((old, float(until)))
    return GroupKey(group, secret, tuple(previous))


def _parse_line(words: list[str], source: str) -> tuple[str, bytes]:
    if len(words) != 4 or words[0] != _MAGIC:
        raise ConfigError(f"{source}: not an elsewhere peer key (expected '{_MAGIC} ...')")
    if words[1] != _FORMAT_VERSION:
        raise ConfigError(f"{source}: key format {words[1]!r} is not supported (only v1)")
    try:
        secret = base64.b64decode(words[3], validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{source}: the key is not valid base64")
    if len(secret) != KEY_BYTES:
        raise ConfigError(f"{source}: the key has {len(secret)} bytes, expected {KEY_BYTES}")
    check_group_name(words[2])
    return words[2], secret


def rotate_key(path: str | os.PathLike[str], group: str | None = None, *, overlap_s: float = 7 * 86400.0,
               now: float | None = None) -> GroupKey:  # fmt: skip
    """Make a new current key in the key file at ``path`` and keep the one it replaces as a
    previous key, accepted for ``overlap_s`` more (previous keys whose overlap is over are
    dropped). Returns the new key. Copy the file to every machine of the group within the
    overlap; peers that read it announce with the new key and accept both meanwhile."""
    if not overlap_s >= 0:
        raise ConfigError(f"the overlap must be >= 0 seconds, got {overlap_s!r}")
    now = time.time() if now is None else now
    old = load_key(path, group)
    kept = tuple((s, until) for s, until in old.previous if until > now)
    previous = ((old.secret, now + overlap_s), *kept)[:_MAX_PREVIOUS]
    write_key(old.group, path, overwrite=True, previous=previous)
    return load_key(path, old.group)


def drop_previous_keys(path: str | os.PathLike[str], group: str | None = None) -> GroupKey:
    """End the overlap now: keep only the current key in the key file at ``path``."""
    key = load_key(path, group)
    write_key(key.group, path, secret=key.secret, overwrite=True)
    return load_key(path, key.group)


def load_key(path: str | os.PathLike[str], group: str | None = None) -> GroupKey:
    """Read a key file, refusing one that others could read.

    Raises :class:`PeerError` when the file is readable or writable by group
    or others, or owned by another user (fix: ``chmod 600 FILE``), and
    :class:`ConfigError` when it is malformed or names another ``group``.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY)
    except FileNotFoundError:
        raise ConfigError(f"no peer key file at {p} (make one with `elsewhere peer keygen GROUP --output {p}`, "
                          "or ew.peer.write_key)")  # fmt: skip
    try:
        st = os.fstat(fd)  # the file actually opened, not a name that could change
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"peer key {p} is not a regular file")
        if st.st_mode & 0o077:
            raise PeerError(
                f"peer key {p} has mode {stat.S_IMODE(st.st_mode):04o}: others may read it. "
                f"Run 'chmod 600 {p}', and make a new key if others may have read it"
            )
        uid = os.getuid()
        if st.st_uid != uid and uid != 0:
            raise PeerError(f"peer key {p} is owned by uid {st.st_uid}, not by you (uid {uid})")
        if st.st_size > 4096:
            raise ConfigError(f"peer key {p} is {st.st_size} bytes: not a key file")
        data = os.read(fd, 4097)
    finally:
        os.close(fd)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"peer key {p} is not a text key file")
    key = replace(parse_key_file(text, source=str(p)), source=str(p))
    if group is not None and key.group != group:
        raise ConfigError(f"peer key {p} is for group {key.group!r}, not {group!r}")
    return key


def find_key(
    group: str = DEFAULT_GROUP, path: str | os.PathLike[str] | None = None
) -> GroupKey | None:
    """Load the key of ``group`` from ``path`` or the default place.

    Returns :data:`LOOPBACK_ONLY` (None) when no key file exists there: the
    caller then works in loopback-only mode. A key file that exists but is
    unsafe or malformed raises, never silently falls back.
    """
    target = Path(path) if path is not None else default_key_path(group)
    if not target.exists():
        return LOOPBACK_ONLY
    return load_key(target, group)
