"""``elsewhere web [--port N] [--host ADDR] [--read-only]``: the web view from a shell.

The parser's part only needs argparse: the ``elsewhere`` command builds every sub-command's
parser on each run, and Starlette is imported only when ``web`` runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from .. import exits
from ..argtypes import port

__all__ = ["add_web_command", "cmd_web"]


def add_web_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``web`` to an ``add_subparsers()`` object; returns its parser."""
    s = subparsers.add_parser(
        "web", help="serve a live web view of jobs, tasks and peers (needs elsewhere[web])",
        description="Serve a live web view of the jobs, their tasks and the peer network on this "
        "machine. The first line printed is the page's URL with its access token; actions "
        "(cancel, retry, purge) need that token. Ctrl-C stops it.",
    )  # fmt: skip
    s.add_argument("--port", type=port, default=None,
                   help="the port (default 8765, or the next free one; 0: any free port)")  # fmt: skip
    s.add_argument("--host", default="127.0.0.1",
                   help="the address to bind (default 127.0.0.1); on any other address every "
                   "request needs the token")  # fmt: skip
    s.add_argument(
        "--read-only", action="store_true", help="refuse every action (cancel, retry, purge)"
    )
    s.add_argument("--peer-port", type=port, default=None, metavar="PORT",
                   help="the peer network's discovery port, as `elsewhere peer list --port` (default 17700)")  # fmt: skip
    s.add_argument("--bench-figures", default=None, metavar="DIR",
                   help="a folder of benchmark figures (bench/figures/*.json) for the benchmarks view "
                   "(default: $ELSEWHERE_BENCH_FIGURES, else those of the source checkout elsewhere runs from)")  # fmt: skip
    s.set_defaults(func=cmd_web)
    return s


def cmd_web(args: argparse.Namespace) -> int:
    from . import require

    require()
    from .server import WebServer

    server = WebServer(args.host, args.port, read_only=args.read_only, peer_port=args.peer_port,
                       bench_figures=args.bench_figures)  # fmt: skip
    print(server.url, flush=True)
    mode = "read-only; " if args.read_only else ""
    print(
        f"elsewhere web: serving on {args.host} port {server.port} ({mode}Ctrl-C stops it)",
        flush=True,
    )
    server.serve_forever()
    return exits.OK
