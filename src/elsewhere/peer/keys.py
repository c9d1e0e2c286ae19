"""Group keys: the shared secret that makes a set of peers a group.

A peer network is a group of peers that share one 32-byte secret. Whoever
holds the key can announce itself, be admitted, and run code on every worker
of the group; whoever does not can do neither. Without a key a peer works in
*loopback-only mode*: it binds, announces and connects on 127.0.0.1 only
(:data:`LOOPBACK_ONLY`, :func:`is_loopback_only`).

Key file format (one text line, UTF-8, mode 0600, owned by the user)::

    elsewhere-peer-key v1 <group> <base64 of 32 bytes>

Blank lines and lines starting with ``#`` are ignored. ``<group>`` is 1-64
characters out of ``A-Z a-z 0-9 . _ -``. The default location of the key of
group ``g`` is ``platformdirs.user_config_dir("elsewhere")/peer/g.key``.

Copy the file to every machine of the group by a channel you trust (scp, a
USB stick); never by mail or chat.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import re
import secrets
import stat
from dataclasses import dataclass, field
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
    "find_key",
    "format_key_file",
    "generate_key",
    "is_loopback_only",
    "load_key",
    "parse_key_file",
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
    revealing it, so that two machines can compare keys.
    """

    group: str
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        check_group_name(self.group)
        if not isinstance(self.secret, bytes) or len(self.secret) != KEY_BYTES:
            raise ConfigError(f"a group key is {KEY_BYTES} bytes, got {len(self.secret)!r}")

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


def format_key_file(key: GroupKey) -> str:
    """The text of a key file for ``key``."""
    encoded = base64.b64encode(key.secret).decode("ascii")
    return f"{_MAGIC} {_FORMAT_VERSION} {key.group} {encoded}\n"


def write_key(
    group: str = DEFAULT_GROUP,
    path: str | os.PathLike[str] | None = None,
    *,
    secret: bytes | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a key file for ``group`` and return its path.

    The file is created with mode 0600 from the start (never readable by
    others, not even for a moment) and appears atomically under its name.
    ``secret`` defaults to a new :func:`generate_key`. An existing file is
    kept, and :class:`ConfigError` raised, unless ``overwrite`` is true.
    Missing parent folders are created with mode 0700.
    """
    key = GroupKey(group, generate_key() if secret is None else secret)
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
    if len(lines) != 1:
        raise ConfigError(f"{source}: expected one line '{_MAGIC} {_FORMAT_VERSION} GROUP KEY'")
    words = lines[0].split()
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
    return GroupKey(words[2], secret)


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
    key = parse_key_file(text, source=str(p))
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
