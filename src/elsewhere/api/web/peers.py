"""The peers view: the workers of the peer groups seen from here, and fair share over time.

The table is what ``elsewhere peer list`` shows: the same keys (every group this user has a
key for, and this user's loopback-only peers), the same discovery settings and the same
announcement fields, and for each peer the cipher a connection from here would use
(:func:`wire_of`). Unlike ``peer list``, which listens for a few seconds, the listeners
run while a page looks at the peers, and stop :data:`_IDLE_S` after the last look.

Fair share: a worker keeps, per controller, a decayed sum of the run time that controller's
tasks used on it (``peer/fairshare.py``). The background workers of this user on this
machine (``elsewhere peer worker --detach``) write it to their stats files every second;
the view samples those files, and the page plots each controller's use over time.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

_IDLE_S = 60.0  # the listeners stop this long after the last look
_SAMPLE_S = 2.0  # fair share is sampled this often
_HISTORY = 450  # samples kept per worker (15 minutes)


class PeerBoard:
    """The listeners of the peers view and the fair-share history (see the module doc)."""

    def __init__(self, discovery: dict[str, Any] | None = None) -> None:
        self.lock = threading.Lock()
        settings: dict[str, Any] = {
            "group": None,
            "key": None,
            "port": None,
            "multicast_group": None,
            "interface": None,
            "peer": [],
        }
        self._args = argparse.Namespace(**{**settings, **(discovery or {})})
        self._listeners: list[Any] = []
        self._problem = ""
        self._port: int | None = None
        self._started_at = 0.0
        self._looked_at = 0.0
        self._sampled_at = 0.0
        self._history: dict[str, deque[tuple[float, dict[str, float]]]] = {}
        self._who: dict[str, str] = {}  # controller peer id -> "user@host"

    # -- listening ---------------------------------------------------------------------------
    def _start(self) -> None:
        from ...peer.discovery import Listener
        from ..peer_cli import _discovery, _keys

        cfg = _discovery(self._args)
        keys = _keys(self._args, all_groups=True)
        keyed = [k for k in keys if k is not None]
        wanted = ([(keyed[0], keyed[1:])] if keyed else []) + ([(None, [])] if None in keys else [])
        problems = []
        for key, more in wanted:
            try:
                self._listeners.append(Listener(key, cfg, more_keys=more).start())
            except OSError as exc:
                problems.append(f"cannot listen on discovery port {cfg.port}: {exc}")
        self._problem = "; ".join(problems)
        self._port = cfg.port

    def stop(self) -> None:
        """Stop the listeners."""
        with self.lock:
            for listener in self._listeners:
                listener.stop()
            self._listeners = []

    def idle(self) -> None:
        """Stop the listeners if no page looked at the peers lately (called now and then)."""
        if self._listeners and time.monotonic() - self._looked_at > _IDLE_S:
            self.stop()

    # -- what the page shows -------------------------------------------------------------------
    def table(self) -> dict[str, Any]:
        """The peers seen (the rows of ``elsewhere peer list --json``), the fair-share history,
        and a note while the listeners have just started (peers announce about once a second)."""
        with self.lock:
            self._looked_at = time.monotonic()
            if not self._listeners:
                self._start()
                self._started_at = time.monotonic()
            rows = self._rows()
            self._sample()
            warming = time.monotonic() - self._started_at < 2.5
            return {"peers": rows, "fair_share": self._series(), "listening": not self._problem,
                    "problem": self._problem, "warming": warming, "port": self._port}  # fmt: skip

    def _rows(self) -> list[dict[str, Any]]:
        rows = []
        now = time.monotonic()
        for listener in self._listeners:
            for p in listener.peers():
                a = p.announcement
                groups = [g or "(loopback)" for g in listener.groups_of(a.peer_id)] or [
                    a.group or "(loopback)"
                ]
                rows.append({
                    "host": a.host, "user": a.user, "group": ",".join(groups), "groups": groups,
                    "state": a.state.name.lower(), "slots": a.slots, "free": a.slots_free,
                    "memory": a.mem_bytes, "time": a.time_s if a.time_s != float("inf") else None,
                    "task": a.task or "", "encrypt": a.encrypt, **wire_of(a.encrypt, a.group, a.ciphers),
                    "address": f"{p.connect_address[0]}:{p.connect_address[1]}", "peer_id": a.peer_id,
                    "seen_s_ago": round(now - p.last_seen),  # (whole seconds: an event a second at most)
                })  # fmt: skip
                if a.state.name.lower() == "controller":
                    self._who[a.peer_id] = f"{a.user}@{a.host}"
        rows.sort(key=lambda r: (r["group"], r["host"], r["state"], r["peer_id"]))
        return rows

    def _sample(self) -> None:
        now = time.time()
        if now - self._sampled_at < _SAMPLE_S:
            return
        self._sampled_at = now
        for pid, stats in _worker_stats():
            shares = stats.get("fair_share")
            if not isinstance(shares, dict):
                continue
            use = {}
            for c, v in shares.items():
                if isinstance(v, dict):
                    use[c] = float(v.get("use_s", 0.0))
                    if v.get("user") or v.get("host"):
                        self._who.setdefault(c, f"{v.get('user', '')}@{v.get('host', '')}")
            self._history.setdefault(str(pid), deque(maxlen=_HISTORY)).append((now, use))

    def _series(self) -> list[dict[str, Any]]:
        """Per worker: its samples as ``{"t": [...], "series": {controller label: [use...]}}``."""
        out = []
        for worker, samples in sorted(self._history.items()):
            names = sorted({c for _, use in samples for c in use})
            out.append({"worker": f"pid {worker}", "t": [t for t, _ in samples],
                        "series": {f"{self._who.get(c, '?')} ({c[:8]})": [use.get(c, 0.0) for _, use in samples]
                                   for c in names}})  # fmt: skip
        return out


#: The ciphers' names as people write them (the protocol's are lower-case ids).
CIPHER_NAMES = {"aes-256-gcm": "AES-256-GCM", "chacha20-poly1305": "ChaCha20-Poly1305"}


def wire_of(encrypt: bool, group: str, ciphers: tuple[str, ...]) -> dict[str, str]:
    """How a peer talks, as the page shows it: ``wire`` (``encrypted: AES-256-GCM``, ``not
    encrypted (--no-encrypt)``, ``not encrypted (loopback only)``) and ``cipher``, the id of the
    cipher a connection from here would use, as ``elsewhere peer list --json`` gives it (its
    choice between the two ends' offers: ``peer.ciphers.cipher_towards``)."""
    if encrypt:
        from ...peer.ciphers import cipher_towards

        cipher = cipher_towards(ciphers)
        if cipher in CIPHER_NAMES:
            return {"wire": f"encrypted: {CIPHER_NAMES[cipher]}", "cipher": cipher}
        return {"wire": "encrypted, but with no cipher in common with this machine", "cipher": ""}
    if group:
        return {"wire": "not encrypted (--no-encrypt)", "cipher": ""}
    return {"wire": "not encrypted (loopback only)", "cipher": ""}


def _worker_stats() -> list[tuple[int, dict[str, Any]]]:
    """(pid, stats) of this user's background peer workers that run (``peer worker --detach``
    records them under ``<home>/peer/workers``)."""
    import psutil

    from ...util import paths

    folder = paths.home() / "peer" / "workers"
    out = []
    for rec_path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if not rec_path.stem.isdigit():
            continue
        try:
            rec = json.loads(rec_path.read_text())
            pid = int(rec["pid"])
            if not psutil.pid_exists(pid):
                continue
            stats = json.loads(Path(rec["stats"]).read_text())
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(stats, dict) and stats.get("pid") == pid:
            out.append((pid, stats))
    return out
