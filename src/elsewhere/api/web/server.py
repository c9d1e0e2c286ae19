"""Serving the web view: a socket bound first (so the URL is known before anything else is
said), uvicorn on it, in the foreground (``elsewhere web``) or in a thread (``ew.web()``)."""

from __future__ import annotations

import errno
import os
import socket
import threading
from typing import Any

import uvicorn

from ...util.errors import ConfigError
from .access import Rules, is_loopback, new_token

DEFAULT_PORT = 8765
_TRIES = 20  # the default port in use: the next ones are tried


class WebServer:
    """A web view of this user's jobs and peers, bound to ``host``:``port``.

    ``url`` is the address to open, with the access token (``.../?token=...``); ``port`` the
    port bound (``port=None``: 8765 or the next free one; ``0``: any free one). ``start()``
    serves in a background thread, ``serve_forever()`` in this one until Ctrl-C or ``stop()``.
    """

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, *, read_only: bool = False,
                 token: str | None = None, peer_port: int | None = None,
                 bench_figures: str | os.PathLike[str] | None = None) -> None:  # fmt: skip
        from .app import WebApp
        from .benchfigures import BenchFigures
        from .peers import PeerBoard

        self.host = host
        self.sock = _bind(host, port)
        self.port = int(self.sock.getsockname()[1])
        self.token = token or new_token()
        self.read_only = read_only
        self.rules = Rules(self.token, loopback=is_loopback(host), read_only=read_only)
        self.app = WebApp(self.rules, peers=PeerBoard({"port": peer_port} if peer_port else None),
                          bench=BenchFigures(bench_figures))  # fmt: skip
        config = uvicorn.Config(self.app.asgi, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1, server_header=False)  # fmt: skip
        self._server = _Server(config, self.app)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The page's address with its access token."""
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/?token={self.token}"

    def serve_forever(self) -> None:
        """Serve until Ctrl-C (or ``stop()`` from another thread)."""
        try:
            self._server.run(sockets=[self.sock])
        finally:
            self._closed()

    def start(self) -> WebServer:
        """Serve in a background thread; returns at once (``stop()`` ends it)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.serve_forever, name="elsewhere-web", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving (open pages lose their connection) and wait for it."""
        self.app.stopping = True
        self._server.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _closed(self) -> None:
        self.app.stopping = True
        self.app.peers.stop()
        self.sock.close()

    def __repr__(self) -> str:
        return f"<elsewhere web view at {self.url}{' (read-only)' if self.read_only else ''}>"

    def _repr_html_(self) -> str:  # a notebook shows a link
        import html

        return f'<a href="{html.escape(self.url)}" target="_blank">elsewhere web view</a>'


class _Server(uvicorn.Server):
    """uvicorn's server, which tells the event streams to end when it is asked to exit (else
    each open page would hold the shutdown for the graceful timeout)."""

    def __init__(self, config: Any, app: Any) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._app.stopping = True
        super().handle_exit(sig, frame)


def _bind(host: str, port: int | None) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (see :class:`WebServer` for ``port``)."""
    if port is not None and not 0 <= port <= 65535:
        raise ConfigError(f"--port must be 0 to 65535, not {port}")
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot serve on host {host!r}: {exc.strerror}") from exc
    family, _, _, _, addr = infos[0]
    ports = [port] if port is not None else list(range(DEFAULT_PORT, DEFAULT_PORT + _TRIES))
    last: OSError | None = None
    for p in ports:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((addr[0], p, *addr[2:]))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            last = exc
            if exc.errno == errno.EADDRINUSE:
                continue
            break
        sock.setblocking(False)
        return sock
    what = f"port {port}" if port is not None else f"ports {ports[0]}-{ports[-1]}"
    hint = " (another program uses it: pick another with --port, or --port 0 for any free one)" if (
        last is not None and last.errno == errno.EADDRINUSE) else ""  # fmt: skip
    raise ConfigError(f"cannot serve on {host} {what}: {last.strerror if last else 'failed'}{hint}")
