"""The live web view: ``elsewhere web`` and ``ew.web()``.

A page, served on this machine, that shows the jobs of the registry, one job in detail (its
progress, a Gantt of its tasks per worker, its task table with each task's output and
traceback, its cluster and job scripts, plots of its throughput and task durations), the
peer network and the benchmark figures of a source checkout, pushed live to the page
(server-sent events), and acts on jobs (cancel, retry, purge) only for whoever holds the
access token printed with its URL::

    browser --GET page, data------------> app.py (Starlette) --> board.py --> watch.py --+
       ^   --GET /api/events (stream)-->     |  access.py: token,       jobs of the      |  open_job,
       |                                     |  read-only, Host         registry         |  control.snapshot,
       +---- events: jobs, job, peers <------+                                            |  journal reader
       |   --POST cancel/retry/purge------> actions.py --> core.control (the only writes)  |
       |                                     peers.py --> peer.discovery Listener          |
       |                                     benchfigures.py --> bench/figures/*.json       |
       +--- static/: index.html, app.js, gantt.js, charts.js (canvas, no CDN) <-- columns.py

Needs Starlette and uvicorn: ``pip install 'elsewhere[web]'``. docs/web.md is the user's page.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...util.errors import ConfigError

if TYPE_CHECKING:
    from .server import WebServer

__all__ = ["require", "web"]

MISSING = ("the web view needs Starlette and uvicorn, which are not installed: "
           "pip install 'elsewhere[web]'")  # fmt: skip


def require() -> None:
    """ConfigError naming the ``web`` extra if Starlette or uvicorn cannot be imported."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"{MISSING} ({exc})") from exc


def web(port: int | None = None, host: str = "127.0.0.1", *, read_only: bool = False,
        block: bool = False, token: str | None = None, peer_port: int | None = None,
        bench_figures: str | os.PathLike[str] | None = None) -> WebServer:  # fmt: skip
    """Serve the live web view of jobs, tasks and peers; print its URL (with its access
    token) and return the server.

    Args:
        port: the port (default 8765, or the next free one; 0: any free port).
        host: the address to bind: loopback by default. On any other address every request
            needs the token.
        read_only: refuse every action (cancel, retry, purge).
        block: serve in this thread until Ctrl-C; by default the view runs in a background
            thread (from a notebook or a script) until ``server.stop()`` or the end of the
            process.
        token: the access token (default: a random one).
        peer_port: the peer network's discovery port (default 17700), for the peers view.
        bench_figures: a folder of benchmark figures (``bench/figures/*.json``) for the
            benchmarks view; by default ``$ELSEWHERE_BENCH_FIGURES``, else those of the source
            checkout this package runs from, if any.

    Returns:
        The :class:`~elsewhere.api.web.server.WebServer`: ``.url``, ``.port``, ``.stop()``.
    """
    require()
    from .server import WebServer

    server = WebServer(host, port, read_only=read_only, token=token, peer_port=peer_port,
                       bench_figures=bench_figures)  # fmt: skip
    print(server.url, flush=True)
    if block:
        server.serve_forever()
    else:
        server.start()
    return server
