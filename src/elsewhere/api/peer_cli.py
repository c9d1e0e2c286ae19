"""``elsewhere peer worker|stop|list|keygen``: the peer network from a shell.

    elsewhere peer worker                         offer this machine's cores (peerworker)
    elsewhere peer worker --maxtime 8h --maxidle 1h --memavail 8G --slots 4 --group lab
    elsewhere peer worker --detach ...            the same in the background (outlives the terminal)
    elsewhere peer stop [--now]                   stop this user's background workers (they drain)
    elsewhere peer list                           every peer seen: host, user, group, state, ...
    elsewhere peer keygen lab [--output FILE]     a new group key, mode 0600 (--rotate: in place of
                                                  the old one, both accepted for a while: peer_keygen.py)

The main ``elsewhere`` command calls :func:`add_peer_commands` with its
sub-parsers; every handler returns an exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from ..util.docsite import page
from . import exits, jsonout
from .argtypes import Parser, count, nonnegative, port, positive, seconds
from .peer_keygen import add_keygen_command, cmd_keygen

__all__ = ["add_peer_commands", "cmd_keygen", "cmd_list", "cmd_stop", "cmd_worker", "worker_options"]


def add_peer_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``peer worker|list|keygen`` to an ``add_subparsers()`` object; returns the parser."""
    p = subparsers.add_parser("peer", help="the peer network: offer cores, list peers, make keys",
                              description="The peer network: offer this machine's cores "
                              "(worker), list the peers seen (list), make a group key (keygen).")  # fmt: skip
    sub = p.add_subparsers(dest="peer_command", required=True)

    w = sub.add_parser("worker", help="offer this machine's cores to a peer group (runs until stopped)",
                       description="Run a peer worker. Ctrl-C or SIGTERM drains: running tasks "
                       "finish and are delivered; a second Ctrl-C hands them back.")  # fmt: skip
    _group_args(w, repeat=True)
    w.add_argument("--slots", type=count, default=None, help="tasks at once (cores on offer; default: all)")
    w.add_argument("--memavail", help="memory on offer, e.g. 8G (a bare number is MiB; default: the machine's)")
    w.add_argument("--timavail", help="longest a single task may run, e.g. 2h (default: no limit)")
    w.add_argument("--maxtime", help="stop (draining) after this long, e.g. 8h")
    w.add_argument("--maxidle", help="stop after this long without tasks, e.g. 1h")
    w.add_argument("--maxnum", type=count, default=None, help="stop after this many tasks")
    w.add_argument("--grace", default="10min",
                   help="how long a controller may be away (its connection lost: a laptop asleep, a "
                   "network cut) before its running tasks are stopped and its finished results "
                   "dropped (default 10min)")  # fmt: skip
    w.add_argument("--allow-user", action="append", default=[], metavar="USER",
                   help="serve only these users (as the authenticated member names itself); may "
                   "repeat")  # fmt: skip
    w.add_argument("--refuse-user", action="append", default=[], metavar="USER",
                   help="never serve this user; may repeat; refuse wins over allow")  # fmt: skip
    w.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                   help="serve only these hosts: name, address or network (10.1.2.0/24), matched "
                   "against the connection's source address; may repeat")  # fmt: skip
    w.add_argument("--refuse-host", action="append", default=[], metavar="HOST",
                   help="never serve this host (name, address or network); may repeat")  # fmt: skip
    w.add_argument("--bind", help="address to accept tasks on (default: the interface, or all)")
    w.add_argument("--tcp-port", type=port, default=0, help="TCP port for tasks (default: any free)")
    w.add_argument("--no-encrypt", action="store_true",
                   help="with a group key: tasks and results in clear text (authenticated only), for "
                   "controllers that turned encryption off too (ew.peers(..., encrypt=False)); both "
                   "ends must agree")  # fmt: skip
    w.add_argument("--fcfs", action="store_true",
                   help="first come, first served instead of fair share between controllers")  # fmt: skip
    w.add_argument("--half-life", type=positive, default=60.0,
                   help="seconds after which a controller's use counts half (fair share)")  # fmt: skip
    w.add_argument("--busy-poll", type=nonnegative, default=2.0, metavar="MS",
                   help="milliseconds to keep polling, awake, after each frame or task result (the "
                   "daemon) and after each batch (the process that ran it): "
                   "tiny tasks go faster, at the cost of a busy core meanwhile (0: off; default 2)")  # fmt: skip
    w.add_argument("--stats-file", help="write counters (JSON) here every second and at exit")
    w.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="how much the worker logs (default: info)")  # fmt: skip
    w.add_argument("--detach", action="store_true",
                   help="run in the background, in a session of its own (it outlives the terminal "
                   "and the login); its log goes to <home>/peer/workers/; stop it with "
                   "`elsewhere peer stop`")  # fmt: skip
    w.set_defaults(func=cmd_worker)

    st = sub.add_parser("stop", help="stop this user's background workers (--detach); they drain first",
                        description="Stop the peer workers this user started here with --detach: "
                        "each finishes (or, with --now, hands back) its running tasks, delivers "
                        "their results, and exits.")  # fmt: skip
    st.add_argument("pid", nargs="*", type=count, help="only these workers (default: all of them)")
    st.add_argument("--now", action="store_true",
                    help="hand running tasks back to their controllers instead of finishing them")  # fmt: skip
    st.add_argument("--timeout", type=seconds, default=600.0,
                    help="seconds to wait for them to exit (default 600)")  # fmt: skip
    st.set_defaults(func=cmd_stop)

    ls = sub.add_parser("list", help="list every peer seen: host, user, group, state, slots, memory")
    _group_args(ls, all_groups=True)
    ls.add_argument("--wait", type=nonnegative, default=2.5, help="seconds to listen (default 2.5)")
    ls.add_argument("--json", action="store_true", help=f"as strict JSON (see {page('cli')})")
    ls.set_defaults(func=cmd_list)

    add_keygen_command(sub)
    return p


def _group_args(p: argparse.ArgumentParser, *, all_groups: bool = False, repeat: bool = False) -> None:
    what = "listen in" if all_groups else "join"
    many: dict[str, Any] = {"action": "append", "default": []} if repeat else {}
    p.add_argument("--group", **many, help=f"peer group to {what} (its key: <config dir>/peer/GROUP.key)"
                   + ("; default: every group you have a key for" if all_groups else
                      "; default: 'default' if its key exists, else loopback only")
                   + ("; may repeat: one worker, its slots shared by the groups" if repeat else ""))  # fmt: skip
    p.add_argument("--key", **many, help="key file (instead of the default place)"
                   + ("; may repeat (with --group: one group per key file, in order)" if repeat else ""))  # fmt: skip
    p.add_argument("--port", type=port, default=None, help="discovery port (default 17700)")
    p.add_argument("--multicast-group", default=None, help="multicast address, or 'none'")
    p.add_argument("--interface", default=None, help="local IPv4 address of the network to use")
    p.add_argument("--peer", action="append", default=[], metavar="HOST[:PORT]",
                   help="a peer to announce to where multicast is not allowed; may repeat")  # fmt: skip


def _keys(args: argparse.Namespace, *, all_groups: bool) -> list[Any]:
    """The group keys the arguments name (None: loopback-only mode)."""
    from ..peer.keys import DEFAULT_GROUP, load_key
    from ..peer.keys import default_key_path as key_path
    from ..util.errors import ConfigError

    if args.key:
        return [load_key(Path(args.key).expanduser(), args.group)]
    if args.group:
        path = key_path(args.group)
        if not path.exists():
            raise ConfigError(f"no key for peer group {args.group!r} at {path}: make one with "
                              f"`elsewhere peer keygen {args.group}`")  # fmt: skip
        return [load_key(path, args.group)]
    if all_groups:
        from ..util import paths

        found = [load_key(p) for p in sorted((paths.config_dir() / "peer").glob("*.key"))]
        return [*found, None]
    path = key_path(DEFAULT_GROUP)
    return [load_key(path, DEFAULT_GROUP) if path.exists() else None]


def _worker_keys(args: argparse.Namespace) -> list[Any]:
    """The keys of the groups a worker serves (repeated --group / --key); [None]: loopback only."""
    from ..util.errors import ConfigError

    groups, files = list(args.group or []), list(args.key or [])
    if files and groups and len(groups) != len(files):
        raise ConfigError("with --key, give one --group per key file (in the same order), or none")
    pairs = zip(files, groups or [None] * len(files)) if files else ((None, g) for g in groups or [None])
    return [_keys(argparse.Namespace(key=f, group=g), all_groups=False)[0] for f, g in pairs]


def _discovery(args: argparse.Namespace) -> Any:
    from ..peer.discovery import DEFAULT_MULTICAST_GROUP, DEFAULT_PORT, DiscoveryConfig, parse_peer

    port = DEFAULT_PORT if args.port is None else args.port
    group = args.multicast_group or DEFAULT_MULTICAST_GROUP
    return DiscoveryConfig(
        port=port, multicast_group=None if group.lower() == "none" else group,
        interface=args.interface, static_peers=tuple(parse_peer(p, port) for p in args.peer),
    )  # fmt: skip


def worker_options(args: argparse.Namespace) -> Any:
    """The :class:`~elsewhere.peer.options.WorkerOptions` that ``peer worker`` arguments ask for."""
    from ..peer.access import AccessRules
    from ..peer.options import WorkerOptions
    from ..util.units import parse_duration, parse_size

    keys = _worker_keys(args)
    extra: dict[str, Any] = {}
    if args.slots is not None:
        extra["slots"] = args.slots
    grace = _grace(args.grace)  # running tasks and kept results: one wait
    return WorkerOptions(
        key=keys[0], more_keys=tuple(k for k in keys[1:] if k is not None), discovery=_discovery(args), bind=args.bind, port=args.tcp_port,
        memavail=parse_size(args.memavail, what="--memavail"),
        timavail=parse_duration(args.timavail, what="--timavail") or math.inf,
        maxtime=parse_duration(args.maxtime, what="--maxtime") or math.inf,
        maxidle=parse_duration(args.maxidle, what="--maxidle") or math.inf,
        maxnum=args.maxnum,
        orphan_s=grace, keep_results_s=grace,
        access=AccessRules(tuple(args.allow_user), tuple(args.refuse_user),
                           tuple(args.allow_host), tuple(args.refuse_host)),
        fair_share=not args.fcfs, half_life_s=args.half_life, stats_file=args.stats_file,
        poll_s=args.busy_poll / 1000.0, encrypt=not args.no_encrypt,
        **extra,
    )  # fmt: skip


def _grace(text: str) -> float:
    from ..util.errors import ConfigError
    from ..util.units import parse_duration

    seconds = parse_duration(text, what="--grace")
    if not seconds:
        raise ConfigError(f"--grace must be a duration above 0, such as '10min', got {text!r}")
    return seconds


def cmd_worker(args: argparse.Namespace) -> int:
    """``elsewhere peer worker``: run the daemon in the foreground until it drains (or, with
    ``--detach``, start it in the background and return once it listens)."""
    import logging

    from ..peer.daemon import PeerWorker

    if getattr(args, "detach", False):
        return _detach(args)
    import os

    opts = worker_options(args)  # bad arguments first: one line, before any logging
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s elsewhere peer: %(message)s")  # fmt: skip
    if opts.key is None:
        print("elsewhere peer: no group key: loopback-only mode (this user's controllers on this "
              "machine only). Make a key with `elsewhere peer keygen default` to join a network.",
              file=sys.stderr)  # fmt: skip
    worker = PeerWorker(opts)
    host, port = worker.start()
    how = "`elsewhere peer stop`" if os.environ.get("ELSEWHERE_PEER_DETACHED") else "Ctrl-C"
    print(f"elsewhere peer worker {worker.peer_id[:8]} listening on {host}:{port} "
          f"(discovery port {opts.discovery.port}); {how} to stop", file=sys.stderr, flush=True)  # fmt: skip
    return worker.serve()


def _workers_dir() -> Path:
    from ..util import paths

    return paths.home() / "peer" / "workers"


def _detach(args: argparse.Namespace) -> int:
    """Start ``peer worker`` (these arguments but ``--detach``) in a new session, its output in
    a log file; wait until it listens, record it for ``peer stop``, and say where it is."""
    import os
    import secrets

    from ..util import paths

    opts = worker_options(args)  # bad arguments are reported here, before anything starts
    argv = sys.argv[1:]
    if "--detach" not in argv or "worker" not in argv:
        from ..util.errors import ConfigError

        raise ConfigError("--detach works from the command line (`elsewhere peer worker --detach ...`)")
    others = list(_running_records().values())
    if others:  # each offers its slots: two on one machine offer its cores twice
        print(f"elsewhere peer: note: {len(others)} background worker(s) of this user already run here ("
              + ", ".join(f"pid {r['pid']}, group {r['group']}" for r in others)
              + "); each offers its own slots (`elsewhere peer stop PID` stops one)", file=sys.stderr)  # fmt: skip
    folder = _workers_dir()
    paths.private_dir(folder)
    stem = folder / f"worker-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    log_path, stats = stem.with_suffix(".log"), stem.with_suffix(".stats.json")
    argv = [a for a in argv if a != "--detach"]
    if not args.stats_file:
        argv += ["--stats-file", str(stats)]
    stats = Path(args.stats_file or stats).expanduser()
    from ..hosts.spawn import spawn_python

    with open(paths.private_file(log_path, os.O_WRONLY | os.O_APPEND), "ab") as log:
        proc = spawn_python(["-m", "elsewhere", *argv], log=log.fileno(), importable=False,
                            env={**os.environ, "ELSEWHERE_PEER_DETACHED": "1"})  # fmt: skip
    deadline = time.monotonic() + 30
    port = None
    while port is None:
        try:
            port = json.loads(stats.read_text()).get("port")
        except (OSError, ValueError):
            pass
        if port is None and (proc.poll() is not None or time.monotonic() > deadline):
            if proc.poll() is None:
                proc.terminate()
            tail = log_path.read_text(errors="replace").strip().splitlines()[-10:]
            print("elsewhere peer: the background worker did not start"
                  + (f" (it exited with code {proc.returncode})" if proc.returncode is not None else "")
                  + f"; its log ({log_path}) ends:\n  " + "\n  ".join(tail), file=sys.stderr)  # fmt: skip
            return 1
        time.sleep(0.05)
    group = ", ".join(k.group for k in opts.group_keys()) or "(loopback only)"
    record = {"pid": proc.pid, "group": group, "port": port, "log": str(log_path), "stats": str(stats),
              "started": time.time(), "argv": argv}  # fmt: skip
    tmp = stem.with_suffix(f".{os.getpid()}.tmp")
    paths.write_private(tmp, json.dumps(record))
    os.replace(tmp, folder / f"{proc.pid}.json")
    print(f"elsewhere peer worker started in the background: pid {proc.pid}, group {group}, "
          f"tasks on port {port}; log: {log_path}\nstop it with `elsewhere peer stop` (it finishes "
          "its running tasks first)")  # fmt: skip
    return 0


def _running_records() -> dict[Path, dict[str, Any]]:
    """The records of this user's background workers that still run (the others are removed:
    they ended on their own, by maxtime, maxidle or a crash)."""
    folder = _workers_dir()
    out = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if not path.stem.isdigit():
            continue
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _our_worker(int(rec.get("pid", -1))):
            out[path] = rec
        else:
            path.unlink(missing_ok=True)
    return out


def _our_worker(pid: int) -> bool:
    """Whether ``pid`` is a running ``elsewhere ... peer worker`` of this user (not a reused pid)."""
    import psutil

    try:
        p = psutil.Process(pid)
        cmd = p.cmdline()
        return p.status() != psutil.STATUS_ZOMBIE and "peer" in cmd and "worker" in cmd and any(
            "elsewhere" in c for c in cmd)  # fmt: skip
    except psutil.Error:
        return False


def cmd_stop(args: argparse.Namespace) -> int:
    """``elsewhere peer stop``: signal this user's background workers, wait until they exit."""
    import os
    import signal

    folder = _workers_dir()
    records = {path: rec for path, rec in _running_records().items()
               if not args.pid or int(rec["pid"]) in args.pid}  # fmt: skip
    if not records:
        which = f"pid {', '.join(map(str, args.pid))}" if args.pid else "background peer workers"
        print(f"elsewhere peer: no {which} of this user running here (records in {folder})")
        return 0
    for rec in records.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(rec["pid"]), signal.SIGTERM)
            if args.now:  # a second signal hands the running tasks back
                time.sleep(0.2)
                os.kill(int(rec["pid"]), signal.SIGTERM)
    what = "handing back" if args.now else "finishing"
    print(f"elsewhere peer: stopping {len(records)} worker(s) ({what} their running tasks): "
          + ", ".join(f"pid {r['pid']} (group {r['group']})" for r in records.values()), flush=True)  # fmt: skip
    deadline = time.monotonic() + args.timeout
    last_note = time.monotonic()
    while records:
        for path, rec in list(records.items()):
            if not _our_worker(int(rec["pid"])):
                path.unlink(missing_ok=True)
                if rec.get("stats"):
                    Path(rec["stats"]).unlink(missing_ok=True)  # its log stays
                del records[path]
        if not records:
            break
        now = time.monotonic()
        if now > deadline:
            print(f"elsewhere peer: still running after {args.timeout:g} s: "
                  + ", ".join(f"pid {r['pid']}" for r in records.values())
                  + "; `elsewhere peer stop --now` hands their tasks back", file=sys.stderr)  # fmt: skip
            return 1
        if now - last_note > 10:
            last_note = now
            print(f"  waiting for {len(records)} worker(s) to finish their tasks "
                  f"({now - deadline + args.timeout:.0f} s) ...", flush=True)  # fmt: skip
        time.sleep(0.1)
    print("elsewhere peer: stopped")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """``elsewhere peer list``: listen for announcements, then print the peers seen."""
    from ..peer.ciphers import cipher_towards
    from ..peer.discovery import Listener
    from ..util.units import format_duration, format_size

    cfg = _discovery(args)
    keys = _keys(args, all_groups=True)
    keyed = [k for k in keys if k is not None]
    # the groups of keys: one socket for them all (a unicast datagram reaches one socket of
    # a port), so a worker of several is one line; this user's loopback-only peers apart
    wanted = ([(keyed, keyed[0], keyed[1:])] if keyed else []) + ([([None], None, [])] if None in keys else [])
    listeners = []
    for heard, key, more in wanted:
        try:
            listeners.append((heard, Listener(key, cfg, more_keys=more).start()))
        except OSError as exc:
            print(f"elsewhere peer: cannot listen on port {cfg.port}: {exc}", file=sys.stderr)
    time.sleep(max(0.0, args.wait))
    rows: list[dict[str, Any]] = []
    now = time.monotonic()
    for _heard, listener in listeners:
        for p in listener.peers():
            a = p.announcement
            groups = [g or "(loopback)" for g in listener.groups_of(a.peer_id)] or [a.group or "(loopback)"]
            rows.append({
                "host": a.host, "user": a.user, "group": ",".join(groups), "groups": groups,
                "state": a.state.name.lower(), "slots": a.slots, "free": a.slots_free,
                "memory": a.mem_bytes, "time": a.time_s, "task": a.task or "", "encrypt": a.encrypt,
                "wire": f"encrypted ({cipher_towards(a.ciphers)})" if a.encrypt else "clear (--no-encrypt)" if a.group
                else "loopback", "cipher": cipher_towards(a.ciphers) if a.group else "", "ciphers": list(a.ciphers),
                "address": f"{p.connect_address[0]}:{p.connect_address[1]}", "peer_id": a.peer_id,
                "seen_s_ago": round(now - p.last_seen, 1),
            })  # fmt: skip
        listener.stop()
    rows.sort(key=lambda r: (r["group"], r["host"], r["state"], r["peer_id"]))
    if args.json:
        print(jsonout.dumps(rows))
        return 0
    listed = {r["address"].rsplit(":", 1)[0] for r in rows}
    refused: dict[str, tuple[int, str, bool]] = {}
    for _heard, listener in listeners:  # (one listener's refusal may be the other's peer)
        for src, got in listener.refusals(within_s=args.wait + 1.0).items():
            if src not in listed and (src not in refused or got[2]):
                refused[src] = got
    notes = refusal_lines(refused)
    if not rows:
        for text in notes:
            print(text)
        heard = [f"group {key.group!r} (key {key.fingerprint})" if key else "this user's loopback-only peers"
                 for keys_heard, _ in listeners for key in keys_heard]  # fmt: skip
        print(f"no peers seen in {args.wait:g} s on discovery port {cfg.port}, listening for "
              f"{', '.join(heard) or 'nothing'}.\n"
              "A worker is listed once it announces itself with the same discovery port (--port) and "
              "the same key (the worker's first log line shows its fingerprint); where multicast "
              "does not reach it, name it with --peer HOST:PORT. None running? Start one with "
              "`elsewhere peer worker`.")  # fmt: skip
        return 0
    header = ["host", "user", "group", "state", "slots", "memory", "time", "wire", "task", "address"]
    table: list[list[str]] = [[r["host"], r["user"], r["group"], r["state"], f"{r['free']}/{r['slots']}",
              format_size(r["memory"]) if r["state"] != "controller" else "",
              format_duration(r["time"]) if r["state"] != "controller" else "",
              r["wire"], r["task"], r["address"]] for r in rows]  # fmt: skip
    widths = [max(len(str(line[i])) for line in [header, *table]) for i in range(len(header))]
    for line in [header, *table]:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())
    for text in notes:
        print(text)
    return 0


def refusal_lines(refused: dict[str, tuple[int, str, bool]]) -> list[str]:
    """What to say of the sources whose announcements were refused (see
    :meth:`.discovery.Listener.refusals`): each member of the group by name and reason,
    the others in one line."""
    lines = [f"refused the announcements of {src} ({n}), a member of the group: {why}"
             for src, (n, why, authentic) in sorted(refused.items()) if authentic]  # fmt: skip
    others = [f"{src} ({n})" for src, (n, _why, authentic) in sorted(refused.items()) if not authentic]
    if others:
        lines.append("heard announcements that no key here authenticates (another group, or another "
                     f"key for this one) from {', '.join(others)}")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m elsewhere.api.peer_cli ...``: the peer commands without the main ``elsewhere`` one
    (the same parser, error lines and exit codes)."""
    parser = Parser(prog="elsewhere")
    add_peer_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return exits.run(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
