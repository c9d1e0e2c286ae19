"""``elsewhere peer keygen``: a new group key, or a new one in place of the old (rotation).

    elsewhere peer keygen lab                      a new key, mode 0600 (refuses to replace one)
    elsewhere peer keygen lab --rotate [--overlap 7d]
                                                   a new key; the old one stays beside it,
                                                   accepted until the overlap ends
    elsewhere peer keygen lab --drop-old           end the overlap now: the old key opens nothing

Part of the ``elsewhere peer`` commands (:mod:`.peer_cli` adds them).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

__all__ = ["add_keygen_command", "cmd_keygen"]


def add_keygen_command(sub: Any) -> None:
    """Add ``keygen`` to the ``elsewhere peer`` sub-parsers."""
    k = sub.add_parser("keygen", help="make a new group key (mode 0600), or rotate one",
                       description="Make a new group key (mode 0600). --rotate replaces the key of "
                       "a group by a new one and keeps the old one beside it, accepted by peers "
                       "that read the file until the overlap ends (announcements and handshakes "
                       "use the new one); --drop-old ends the overlap at once.")  # fmt: skip
    k.add_argument("group", help="group name: 1-64 of A-Z a-z 0-9 . _ -")
    k.add_argument("--output", "-o", help="key file (default: <config dir>/peer/GROUP.key)")
    k.add_argument("--force", action="store_true", help="replace an existing key file (no overlap)")
    k.add_argument("--rotate", action="store_true",
                   help="a new key in place of the existing one, which stays accepted for --overlap")  # fmt: skip
    k.add_argument("--overlap", default="7d",
                   help="with --rotate: how long the old key is still accepted (default 7d): the "
                   "time to copy the new file to every machine of the group")  # fmt: skip
    k.add_argument("--drop-old", action="store_true",
                   help="end the overlap now: keep only the current key (a copy of an old one then "
                   "opens nothing on this machine)")  # fmt: skip
    k.set_defaults(func=cmd_keygen)


def cmd_keygen(args: argparse.Namespace) -> int:
    """``elsewhere peer keygen GROUP``: write a new key file, mode 0600 (or rotate one)."""
    from ..peer.keys import default_key_path as key_path
    from ..peer.keys import drop_previous_keys, format_time, load_key, rotate_key, write_key
    from ..util.errors import ConfigError
    from ..util.units import parse_duration

    target = Path(args.output).expanduser() if args.output else key_path(args.group)
    if sum(map(bool, (args.rotate, args.drop_old, args.force))) > 1:
        raise ConfigError("give one of --rotate, --drop-old and --force")
    if args.rotate or args.drop_old:
        if not target.exists():
            raise ConfigError(f"no key of group {args.group!r} at {target} to "
                              f"{'rotate' if args.rotate else 'change'}: make one with "
                              f"`elsewhere peer keygen {args.group}`")  # fmt: skip
        old = load_key(target, args.group)
        if args.drop_old:
            key = drop_previous_keys(target, args.group)
            print(f"the key file of peer group {args.group!r} at {target} now holds its current key only "
                  f"(fingerprint {key.fingerprint}); {len(old.previous)} previous key(s) dropped: on this "
                  "machine they open nothing any more (a worker running here reads the file again "
                  "within seconds); do the same on, or copy this file to, every machine of the group")  # fmt: skip
            return 0
        overlap = parse_duration(args.overlap, what="--overlap")
        if overlap is None or overlap == float("inf"):
            raise ConfigError(f"--overlap must be a finite duration such as '7d' or '12h', got {args.overlap!r}")
        key = rotate_key(target, args.group, overlap_s=overlap)
        print(f"new key of peer group {args.group!r} in {target} (fingerprint {key.fingerprint}); the "
              f"old one ({old.fingerprint}) stays beside it, accepted until {format_time(time.time() + overlap)}")
        print("copy the file, by a channel you trust, to every machine of the group within the overlap, "
              "controllers' machines first: peers that read it announce with the new key and accept both; "
              "a peer holding only the old key no longer sees them. A worker running there reads the file "
              f"again within seconds. End the overlap earlier with `elsewhere peer keygen {args.group} "
              "--drop-old` (a former member's copy of the old key then opens nothing)")  # fmt: skip
        return 0
    path = write_key(args.group, target, overwrite=args.force)
    key = load_key(path, args.group)
    print(f"wrote the key of peer group {args.group!r} to {path} (fingerprint {key.fingerprint})")
    print("copy it, by a channel you trust, to every machine of the group (same path, mode 0600)")
    return 0
