"""A running worker reads its key files again when they change: a rotation reaches it.

``elsewhere peer keygen GROUP --rotate`` (or a new key file copied over the old one) writes a
new current key with the previous one beside it; ``--drop-old`` (or the previous key's time
running out) ends the overlap. :class:`KeyWatch` notices a changed file (its size, time and
inode, looked at every :data:`CHECK_EVERY_S`) and gives the keys as the file now says; the
daemon then announces with the new key, takes it for new connections, and closes the
connections whose handshake proved a key it no longer accepts (:func:`retired`), so that a
former member's copy of an old key stops working at once, open connections included.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

from ..util.errors import ElsewhereError
from .keys import GroupKey, load_key

__all__ = ["CHECK_EVERY_S", "KeyWatch", "retired"]

log = logging.getLogger("elsewhere.peer.daemon")

CHECK_EVERY_S = 2.0
"""How often the key files are looked at (one ``stat`` each)."""


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class KeyWatch:
    """The key files of ``keys`` (those read from a file), and whether they changed."""

    def __init__(self, keys: Sequence[GroupKey]) -> None:
        self.keys = list(keys)
        self.changed = False
        self._stamps = {k.source: _stamp(k.source) for k in self.keys if k.source}
        self._last = time.monotonic()

    def check(self, now: float) -> list[GroupKey] | None:
        """Every :data:`CHECK_EVERY_S` (``now``: monotonic), the keys as their files say now
        (:attr:`changed`: whether any changed since the last look); None in between, and
        without keys. A file that is gone or unreadable keeps its keys (and is logged)."""
        if now - self._last < CHECK_EVERY_S or not self.keys:
            return None
        self._last = now
        fresh: list[GroupKey] = []
        changed = False
        for key in self.keys:
            stamp = _stamp(key.source) if key.source else None
            if not key.source or stamp is None or stamp == self._stamps.get(key.source):
                fresh.append(key)
                continue
            self._stamps[key.source] = stamp
            try:
                new = load_key(key.source, key.group)
            except ElsewhereError as exc:
                log.warning("the key file of group %r changed but cannot be read (%s): keeping the keys "
                            "read before", key.group, exc)  # fmt: skip
                fresh.append(key)
                continue
            if new.secret == key.secret and new.previous == key.previous:
                fresh.append(key)
                continue
            changed = True
            fresh.append(new)
            ends = new.overlap_ends()
            log.info("read the key file of group %r again: key %s%s", new.group, new.fingerprint,
                     f", and until {time.ctime(ends)} the previous one(s)" if ends else ", no other")  # fmt: skip
        self.keys = fresh
        self.changed = changed
        return fresh


def retired(secret: bytes, group: str, keys: Sequence[GroupKey], now: float | None = None) -> bool:
    """Whether a connection whose handshake proved ``secret`` (of ``group``) holds a key
    that ``keys`` no longer accept (dropped, or past its overlap)."""
    for key in keys:
        if key.group == group:
            return all(k.secret != secret for k in key.accepted(now))
    return True
